"""Fake Jetson sysfs trees for the telemetry reader, one per documented board, built in a test's tmp_path.

Paths are those jetson-stats (jtop/core/gpu.py, temperature.py, memory.py, fan.py) reads: thermal zones under
/sys/devices/virtual/thermal, the GPU as the /sys/class/devfreq entry (a symlink into /sys/devices, as on a
board) whose device/of_node/name is gv11b (Xavier), ga10b (Orin, JetPack 5) or gpu (Orin, JetPack 6), the
EMC rate in debugfs (bpmp) and its activity in /sys/kernel/actmon_avg_activity/mc_all, the fan as the
pwmfan hwmon. Zone names follow each board's device tree (Orin: cpu/gpu/cv0-2/soc0-2/tj-thermal, no cv
zones on the Orin Nano, which has no DLA; Xavier NX: CPU/GPU/AUX/AO-therm, PMIC-Die, Tdiode_tegra).
Values (temperatures, clocks, trip points) are plausible for each board, not recorded ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple


class Board(NamedTuple):
    zones: list[tuple[str, int]]  # (type, millidegrees C)
    gpu_dev: str  # device folder under sys/devices
    gpu_node: str  # of_node name
    gpu_hz: tuple[int, int]  # cur, max
    gpu_load: int  # per mille
    emc_hz: int
    mc_all: int
    cpu_khz: int
    fan_pwm: int | None
    overcurrent: bool = False


BOARDS: dict[str, Board] = {
    "orin-nano-jp6": Board([("cpu-thermal", 51250), ("gpu-thermal", 49800), ("soc0-thermal", 48900),
                            ("soc1-thermal", 50100), ("soc2-thermal", 49000), ("tj-thermal", 51250)],
                           "platform/bus@0/17000000.gpu", "gpu", (624750000, 624750000), 423, 2133000000,
                           1066000, 1510400, 96),
    "orin-nx-jp5": Board([("cpu-thermal", 47500), ("gpu-thermal", 46000), ("cv0-thermal", 44800),
                          ("cv1-thermal", 45100), ("cv2-thermal", 44900), ("soc0-thermal", 45200),
                          ("soc1-thermal", 46300), ("soc2-thermal", 45900), ("tj-thermal", 47500)],
                         "platform/17000000.ga10b", "ga10b", (918000000, 918000000), 615, 3199000000, 960000,
                         1984000, 120),
    "agx-orin-jp6": Board([("cpu-thermal", 55100), ("gpu-thermal", 53400), ("cv0-thermal", 50200),
                           ("cv1-thermal", 50700), ("cv2-thermal", 50100), ("soc0-thermal", 51800),
                           ("soc1-thermal", 52400), ("soc2-thermal", 51900), ("tj-thermal", 55100)],
                          "platform/bus@0/17000000.gpu", "gpu", (1300500000, 1300500000), 880, 3199000000,
                          2400000, 2201600, 140, True),
    "xavier-nx-jp5": Board([("AO-therm", 37500), ("CPU-therm", 39500), ("GPU-therm", 37500), ("AUX-therm", 39000),
                            ("PMIC-Die", 50000), ("Tdiode_tegra", 40250), ("Tboard_tegra", 37000),
                            ("thermal-fan-est", 38600)],
                           "17000000.gv11b", "gv11b", (510000000, 1109250000), 120, 1600000000, 160000,
                           1907200, 77),
}


def _w(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def make_board(root: Path, name: str, passive_c: float = 99.0) -> Path:
    """The board's tree under ``root`` (pass it as EDGERT_SYSROOT); returns ``root``."""
    b = BOARDS[name]
    thermal = root / "sys/devices/virtual/thermal"
    for i, (kind, milli) in enumerate(b.zones):
        zone = thermal / f"thermal_zone{i}"
        _w(zone / "type", kind)
        _w(zone / "temp", milli)
        _w(zone / "trip_point_0_type", "critical")
        _w(zone / "trip_point_0_temp", 105000)
        _w(zone / "trip_point_1_type", "passive")
        _w(zone / "trip_point_1_temp", int(passive_c * 1000))
    dev = root / "sys/devices" / b.gpu_dev
    node = dev.name
    _w(dev / "of_node/name", b.gpu_node)
    _w(dev / "load", b.gpu_load)
    freq = dev / "devfreq" / node
    _w(freq / "cur_freq", b.gpu_hz[0])
    _w(freq / "max_freq", b.gpu_hz[1])
    _w(freq / "governor", "nvhost_podgov")
    os.symlink(os.path.relpath(dev, freq), freq / "device")
    cls = root / "sys/class/devfreq"
    cls.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(freq, cls), cls / node)
    _w(root / "sys/kernel/debug/bpmp/debug/clk/emc/rate", b.emc_hz)
    _w(root / "sys/kernel/actmon_avg_activity/mc_all", b.mc_all)
    _w(root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", b.cpu_khz)
    if b.fan_pwm is not None:
        _w(root / "sys/class/hwmon/hwmon3/name", "pwmfan")
        _w(root / "sys/class/hwmon/hwmon3/pwm1", b.fan_pwm)
    if b.overcurrent:
        _w(root / "sys/class/hwmon/hwmon5/name", "soctherm_oc")
        for k in (1, 2, 3):
            _w(root / f"sys/class/hwmon/hwmon5/oc{k}_event_cnt", 0)
    return root


def set_value(root: Path, rel: str, value: Any) -> None:
    _w(root / rel, value)
