"""Board telemetry beside the watts: temperatures, clocks, loads, throttling and fan, from what jtop reads.

On a Jetson everything comes from sysfs (under ``EDGERT_SYSROOT``, "/" by default), at the paths
jetson-stats (jtop) reads on JetPack 5 and 6 boards (Orin Nano, Orin NX, AGX Orin, Xavier NX):

- temperatures: ``/sys/devices/virtual/thermal/thermal_zone*/{type,temp}`` (millidegrees), named by the
  zone type without its ``-thermal`` / ``-therm`` suffix, PMIC zones skipped (they read a fixed 50/100 C);
- GPU: the ``/sys/class/devfreq/*`` entry whose ``device/of_node/name`` is ``gv11b`` (Xavier), ``ga10b``
  (Orin, JetPack 5) or ``gpu`` (Orin, JetPack 6): ``cur_freq``/``max_freq`` (Hz) there, ``load``
  (per mille) in its device folder;
- EMC (memory controller): its rate from ``/sys/kernel/debug/bpmp/debug/clk/emc/rate`` (Hz; debugfs, root)
  or ``/sys/kernel/debug/clk/emc/clk_rate``, its load from ``/sys/kernel/actmon_avg_activity/mc_all``
  (activity in kHz of the EMC clock: load = mc_all / rate_kHz);
- CPU: ``/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq`` (kHz);
- fan: the hwmon named ``pwmfan`` / ``pwm_fan``: ``pwm1`` out of 255;
- throttling, the board's own: a thermal zone at or above its first ``passive`` trip point (where the
  kernel starts to cut clocks: ``thermal:<zone>``), and the over-current event counters of the SoC's
  hwmon (``oc*_event_cnt``, Orin) that went up since the last reading (``overcurrent``).

On a desktop GPU the same keys come from NVML (temperature, SM and memory clocks, utilisation, and the
clock-throttle reasons bitmask). Whatever a machine lacks is simply absent; nothing here raises.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from edgert.platform import sysroot

__all__ = ["TelemetryWatch", "read_telemetry"]

log = logging.getLogger(__name__)

_GPU_NAMES = ("gv11b", "ga10b", "gp10b", "gpu")
_EMC_RATES = ("sys/kernel/debug/bpmp/debug/clk/emc/rate", "sys/kernel/debug/clk/emc/clk_rate")
#: NVML clock-throttle reason bits (nvml.h, nvmlClocksEventReasons): the ones that are the board's own.
_NVML_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake"}


def _text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip("\x00\n ")
    except OSError:
        return None


def _num(path: Path) -> float | None:
    text = _text(path)
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def _zone_name(raw: str) -> str:
    for suffix in ("-thermal", "-therm", "_thermal"):
        if raw.endswith(suffix):
            return raw[: -len(suffix)]
    return raw


def _thermal(root: Path, out: dict[str, Any]) -> None:
    temps: dict[str, float] = {}
    throttle: list[str] = []
    for zone in sorted((root / "sys/devices/virtual/thermal").glob("thermal_zone*")):
        raw = _text(zone / "type")
        milli = _num(zone / "temp")
        if not raw or milli is None or "PMIC" in raw.upper():
            continue
        name = _zone_name(raw)
        if name in temps:
            name = f"{name}.{zone.name[len('thermal_zone'):]}"
        celsius = milli / 1000.0
        temps[name] = round(celsius, 3)
        passive = [_num(zone / f"trip_point_{i}_temp") for i in range(16)
                   if _text(zone / f"trip_point_{i}_type") == "passive"]
        limits = [p for p in passive if p is not None and p > 0]
        if limits and milli >= min(limits):
            throttle.append(f"thermal:{name}")
    if temps:
        out["temperatures_c"] = temps
    out.setdefault("throttle", []).extend(throttle)


def _gpu(root: Path, out: dict[str, Any]) -> None:
    for entry in sorted((root / "sys/class/devfreq").glob("*")):
        name = _text(entry / "device/of_node/name")
        if name not in _GPU_NAMES:
            continue
        cur, top = _num(entry / "cur_freq"), _num(entry / "max_freq")
        if cur is not None:
            out.setdefault("clocks_mhz", {})["gpu"] = round(cur / 1e6, 1)
        if top is not None:
            out.setdefault("max_clocks_mhz", {})["gpu"] = round(top / 1e6, 1)
        load = _num(entry / "device/load")
        if load is not None:
            out.setdefault("load", {})["gpu"] = round(load / 1000.0, 4)
        return


def _emc_cpu_fan(root: Path, out: dict[str, Any]) -> None:
    rate = next((r for r in (_num(root / p) for p in _EMC_RATES) if r), None)
    if rate:
        out.setdefault("clocks_mhz", {})["emc"] = round(rate / 1e6, 1)
        activity = _num(root / "sys/kernel/actmon_avg_activity/mc_all")
        if activity is not None:
            out.setdefault("load", {})["emc"] = round(min(activity / (rate / 1000.0), 1.0), 4)
    cpu = _num(root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq")
    if cpu is not None:
        out.setdefault("clocks_mhz", {})["cpu"] = round(cpu / 1000.0, 1)
    for hwmon in sorted((root / "sys/class/hwmon").glob("hwmon*")):
        kind = _text(hwmon / "name") or ""
        if kind in ("pwmfan", "pwm_fan", "pwm-fan"):
            pwm = _num(hwmon / "pwm1")
            if pwm is not None:
                out["fan_ratio"] = round(pwm / 255.0, 4)


def _overcurrent(root: Path) -> dict[str, float]:
    counts: dict[str, float] = {}
    for hwmon in sorted((root / "sys/class/hwmon").glob("hwmon*")):
        for f in sorted(hwmon.glob("oc*_event_cnt")):
            value = _num(f)
            if value is not None:
                counts[f"{hwmon.name}/{f.name}"] = value
    return counts


def _nvml(out: dict[str, Any]) -> None:
    try:
        import pynvml
    except ImportError:  # no NVML bindings: a Jetson, or a desktop without edgert[gpu]
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # no NVIDIA driver: nothing to read (pynvml raises its own NVMLError types)
        return
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            tag = f"nvml{i}"
            out.setdefault("temperatures_c", {})[tag] = float(pynvml.nvmlDeviceGetTemperature(h, 0))
            clocks = out.setdefault("clocks_mhz", {})
            clocks[f"{tag}_sm"] = float(pynvml.nvmlDeviceGetClockInfo(h, 1))
            clocks[f"{tag}_mem"] = float(pynvml.nvmlDeviceGetClockInfo(h, 2))
            out.setdefault("load", {})[tag] = pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
            reasons = int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            out.setdefault("throttle", []).extend(f"{tag}:{name}" for bit, name in _NVML_REASONS.items()
                                                  if reasons & bit)
    except Exception as exc:  # a query this GPU does not support: keep what was read
        log.debug("nvml telemetry: %s", exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # already shut down: nothing to release
            pass


def read_telemetry(root: Path | None = None, nvml: bool = True) -> dict[str, Any]:
    """One reading: ``temperatures_c``, ``clocks_mhz``, ``max_clocks_mhz``, ``load`` (0-1), ``fan_ratio``,
    ``throttle`` (reasons; [] when none), each present only where this machine has it."""
    root = root or sysroot()
    out: dict[str, Any] = {"throttle": []}
    _thermal(root, out)
    _gpu(root, out)
    _emc_cpu_fan(root, out)
    if nvml:
        _nvml(out)
    return out


class TelemetryWatch:
    """Readings over a run: peaks, how long the board throttled itself, and what the frame rate was then.

    :meth:`update` takes the pipeline's current FPS with each reading, so a throttle episode records the
    rate before it and the lowest rate during it: the board's own cut, told apart from edgert's pacing.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self.latest: dict[str, Any] = {}
        self._peaks: dict[str, float] = {}
        self._oc = _overcurrent(root or sysroot())
        self._episodes: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._last_fps = 0.0
        self._readings = 0
        self._throttled = 0

    def update(self, t: float, fps: float) -> dict[str, Any]:
        reading = read_telemetry(self.root)
        oc = _overcurrent(self.root or sysroot())
        if any(v > self._oc.get(k, v) for k, v in oc.items()):
            reading["throttle"].append("overcurrent")
        self._oc = oc
        self._readings += 1
        for zone, c in reading.get("temperatures_c", {}).items():
            self._peaks[zone] = max(self._peaks.get(zone, c), c)
        reasons = sorted(set(reading["throttle"]))
        if reasons:
            self._throttled += 1
            if self._open is None:
                self._open = {"start_s": round(t, 3), "reasons": reasons, "fps_before": round(self._last_fps, 3),
                              "min_fps": round(fps, 3)}
                self._episodes.append(self._open)
            else:
                self._open["reasons"] = sorted(set(self._open["reasons"]) | set(reasons))
                self._open["min_fps"] = round(min(self._open["min_fps"], fps), 3)
            self._open["end_s"] = round(t, 3)
        else:
            self._open = None
            self._last_fps = fps
        self.latest = reading
        return reading

    def summary(self) -> dict[str, Any]:
        return {"readings": self._readings, "peak_temperatures_c": dict(self._peaks),
                "throttled_readings": self._throttled, "throttle_episodes": list(self._episodes),
                "last": dict(self.latest)}
