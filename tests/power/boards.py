"""Fake Jetson (and x86) roots for the power meters, built as real directory trees in a test's tmp_path.

Layouts follow the kernel's Documentation/hwmon/ina3221.rst and ina238.rst, NVIDIA's Jetson Linux
Developer Guide and jetson-stats (jtop/core/power.py): the driver folder under /sys/bus/i2c/drivers is a
symlink to the device under /sys/devices, as on a real board. The tegrastats lines are recorded output
from real boards (sources below); the sysfs values are chosen so that voltage x current gives the same
milliwatts (within tegrastats' rounding to 1 mW).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

# Recorded tegrastats lines.
# Orin Nano 8GB dev kit, JetPack 6.1 (L4T 36.4, kernel 5.15.148-tegra, CUDA 12.6), from a system report
# posted on GitHub ("nvidia-smi / tegrastats" section, 01-04-2025).
ORIN_NANO_JP6_LINE = (
    "01-04-2025 16:02:59 RAM 1273/7620MB (lfb 1x4MB) SWAP 286/3810MB (cached 1MB) "
    "CPU [0%@1036,0%@1036,1%@1036,0%@1036,0%@729,0%@729] GR3D_FREQ 0% cpu@45.875C soc2@45.843C "
    "soc0@44.843C gpu@45.437C tj@46.312C soc1@46.312C VDD_IN 4968mW/4968mW VDD_CPU_GPU_CV 436mW/436mW "
    "VDD_SOC 1708mW/1708mW"
)
# Xavier NX 8GB, JetPack 5 (bracketed GR3D_FREQ and mW units are JetPack 5's format), quoted as the
# example in an edge-metrics exporter's Xavier collector.
XAVIER_NX_JP5_LINE = (
    "RAM 2690/6854MB (lfb 6x1MB) SWAP 479/3427MB (cached 3MB) CPU [3%@1904,7%@1906,1%@1905,0%@1907,off,off] "
    "EMC_FREQ 0%@1600 GR3D_FREQ 0%@[510] VIC_FREQ 601 APE 150 AUX@39C CPU@39.5C AO@37.5C GPU@37.5C PMIC@50C "
    "VDD_IN 5079mW/5079mW VDD_CPU_GPU_CV 696mW/696mW VDD_SOC 1104mW/1104mW"
)
# Xavier NX, JetPack 4 (milliwatts without a unit), from a tegrastats parser's test data.
XAVIER_NX_JP4_LINE = (
    "RAM 4412/7772MB (lfb 237x4MB) SWAP 139/3886MB (cached 2MB) CPU [9%@1190,6%@1190,6%@1190,5%@1190,"
    "4%@1190,8%@1267] EMC_FREQ 10%@1600 GR3D_FREQ 62%@306 APE 150 MTS fg 0% bg 0% AO@41.5C GPU@43C "
    "PMIC@100C AUX@41.5C CPU@43.5C thermal@42.55C VDD_IN 4067/4067 VDD_CPU_GPU_CV 738/738 VDD_SOC 1353/1353"
)
# Jetson Nano, JetPack 4 (POM_ rail names), and AGX Xavier, JetPack 4 (no input rail).
NANO_JP4_LINE = (
    "RAM 1409/3964MB (lfb 28x4MB) SWAP 0/1982MB (cached 0MB) IRAM 0/252kB(lfb 252kB) CPU [22%@518,67%@518,"
    "off,off] EMC_FREQ 0%@1600 GR3D_FREQ 0%@76 APE 25 PLL@28.5C CPU@32C PMIC@50C GPU@30.5C AO@39.5C "
    "thermal@31.25C POM_5V_IN 2003/2003 POM_5V_GPU 0/0 POM_5V_CPU 320/320"
)
AGX_XAVIER_JP4_LINE = (
    "RAM 721/31927MB (lfb 7291x4MB) SWAP 0/15963MB (cached 0MB) CPU [2%@1190,0%@1190,0%@1190,0%@1190,off,"
    "off,off,off] EMC_FREQ 0%@665 GR3D_FREQ 0%@318 APE 150 MTS fg 0% bg 0% AO@37.5C GPU@37.5C Tdiode@40C "
    "PMIC@100C AUX@36C CPU@37.5C thermal@36.9C Tboard@37C GPU 0/0 CPU 311/311 SOC 932/932 CV 0/0 "
    "VDDRQ 621/621 SYS5V 1482/1482"
)

# (label, bus mV, mA) per channel; watts = mV * mA / 1e6
ORIN_NANO_RAILS = [("VDD_IN", 5175, 960), ("VDD_CPU_GPU_CV", 5129, 85), ("VDD_SOC", 5160, 331)]
XAVIER_NX_JP5_RAILS = [("VDD_IN", 5074, 1001), ("VDD_CPU_GPU_CV", 5080, 137), ("VDD_SOC", 5064, 218)]
# (label, mV, mA, mW): the ina3221x driver computes milliwatts itself
XAVIER_NX_JP4_RAILS = [("VDD_IN", 5064, 803, 4067), ("VDD_CPU_GPU_CV", 5048, 146, 738),
                       ("VDD_SOC", 5056, 267, 1353)]


def write_tree(root: Path, files: Mapping[str, str | int]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{content}\n")


def _link(root: Path, link_rel: str, target_rel: str) -> None:
    link = root / link_rel
    link.parent.mkdir(parents=True, exist_ok=True)
    target = root / target_rel
    link.symlink_to(os.path.relpath(target, link.parent), target_is_directory=True)


def ina3221_hwmon(root: Path, device: str, i2c_dev: str, hwmon: str,
                  rails: list[tuple[str, int, int]], summation: bool = True) -> Path:
    """An INA3221 under the mainline hwmon driver (JetPack 5/6/7), with the driver symlink."""
    dev_rel = f"sys/devices/platform/{device}/{i2c_dev}"
    files: dict[str, str | int] = {f"{dev_rel}/name": "ina3221"}
    h = f"{dev_rel}/hwmon/{hwmon}"
    files[f"{h}/name"] = "ina3221"
    for c, (label, mv, ma) in enumerate(rails, start=1):
        files[f"{h}/in{c}_label"] = label
        files[f"{h}/in{c}_enable"] = 1
        files[f"{h}/in{c}_input"] = mv
        files[f"{h}/curr{c}_input"] = ma
        files[f"{h}/curr{c}_crit"] = 7784 if c == 1 else 5000
        files[f"{h}/curr{c}_crit_alarm"] = 0
        files[f"{h}/curr{c}_max"] = 6224 if c == 1 else 4000
        files[f"{h}/curr{c}_max_alarm"] = 0
        files[f"{h}/in{c + 3}_input"] = ma * 5  # shunt voltage in uV over a 5 mOhm shunt
        files[f"{h}/shunt{c}_resistor"] = 5000
    if summation:
        files[f"{h}/in7_label"] = "sum of shunt voltages"
        files[f"{h}/in7_input"] = sum(ma * 5 for _, _, ma in rails)
        files[f"{h}/curr4_input"] = sum(ma for _, _, ma in rails)
        files[f"{h}/curr4_crit"] = 10000
        files[f"{h}/curr4_crit_alarm"] = 0
    files[f"{h}/samples"] = 512
    files[f"{h}/update_interval"] = 143
    write_tree(root, files)
    _link(root, f"sys/bus/i2c/drivers/ina3221/{i2c_dev}", dev_rel)
    return root / h


def tegrastats_script(root: Path, line: str) -> Path:
    """A ``usr/bin/tegrastats`` under the root that prints a recorded line every --interval ms."""
    path = root / "usr/bin/tegrastats"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys, time\n"
        "ms = 1000\n"
        "args = sys.argv[1:]\n"
        "if '--interval' in args:\n"
        "    ms = int(args[args.index('--interval') + 1])\n"
        f"line = {line!r}\n"
        "while True:\n"
        "    print(line, flush=True)\n"
        "    time.sleep(ms / 1000)\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _jetson_files(root: Path, release: str, model: str, conf: str, pmode: int) -> None:
    write_tree(root, {
        "etc/nv_tegra_release": release,
        "proc/device-tree/model": model,
        "etc/nvpmodel.conf": conf,
        "var/lib/nvpmodel/status": f"pmode:{pmode:04d}",
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq": 729600,
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq": 1510400,
    })


ORIN_NANO_NVPMODEL_CONF = """\
# (abridged) /etc/nvpmodel.conf of a Jetson Orin Nano 8GB, JetPack 6.2
< PARAM TYPE=FILE NAME=CPU_ONLINE >
CORE_0 /sys/devices/system/cpu/cpu0/online
CORE_1 /sys/devices/system/cpu/cpu1/online

< PARAM TYPE=CLOCK NAME=CPU_A78_0 >
FREQ_TABLE /sys/devices/system/cpu/cpu0/cpufreq/scaling_available_frequencies
MAX_FREQ /sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq
MIN_FREQ /sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq

< POWER_MODEL ID=0 NAME=15W >
CPU_ONLINE CORE_0 1
CPU_ONLINE CORE_1 1
CPU_A78_0 MIN_FREQ 729600
CPU_A78_0 MAX_FREQ 1510400

< POWER_MODEL ID=1 NAME=7W >
CPU_ONLINE CORE_0 1
CPU_ONLINE CORE_1 1
CPU_A78_0 MIN_FREQ 729600
CPU_A78_0 MAX_FREQ 960000

< POWER_MODEL ID=2 NAME=MAXN_SUPER >
CPU_ONLINE CORE_0 1
CPU_ONLINE CORE_1 1
CPU_A78_0 MIN_FREQ 729600
CPU_A78_0 MAX_FREQ -1

< PM_CONFIG DEFAULT=2 >
"""

XAVIER_NX_NVPMODEL_CONF = """\
< POWER_MODEL ID=0 NAME=MODE_15W_2CORE >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=MODE_15W_4CORE >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MODE_15W_6CORE >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=3 NAME=MODE_10W_2CORE >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=8 NAME=MODE_20W_6CORE >
CPU_ONLINE CORE_0 1
< PM_CONFIG DEFAULT=2 >
"""


def orin_nano_jp6(root: Path) -> Path:
    """Jetson Orin Nano dev kit, JetPack 6: one INA3221 at 1-0040 (mainline hwmon driver)."""
    ina3221_hwmon(root, "bus@0/c240000.i2c/i2c-1", "1-0040", "hwmon1", ORIN_NANO_RAILS)
    _jetson_files(root, "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64",
                  "NVIDIA Jetson Orin Nano Developer Kit", ORIN_NANO_NVPMODEL_CONF, 2)
    tegrastats_script(root, ORIN_NANO_JP6_LINE)
    return root


def xavier_nx_jp5(root: Path) -> Path:
    """Jetson Xavier NX, JetPack 5: the INA3221 at 7-0040 moved to the mainline hwmon driver."""
    ina3221_hwmon(root, "c250000.i2c/i2c-7", "7-0040", "hwmon4", XAVIER_NX_JP5_RAILS, summation=False)
    _jetson_files(root, "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64",
                  "NVIDIA Jetson Xavier NX Developer Kit", XAVIER_NX_NVPMODEL_CONF, 2)
    tegrastats_script(root, XAVIER_NX_JP5_LINE)
    return root


def xavier_nx_jp4(root: Path) -> Path:
    """Jetson Xavier NX, JetPack 4: NVIDIA's ina3221x IIO driver (rail_name_N, in_powerN_input in mW)."""
    dev_rel = "sys/devices/c250000.i2c/i2c-7/7-0040"
    files: dict[str, str | int] = {f"{dev_rel}/name": "ina3221x"}
    iio = f"{dev_rel}/iio:device0"
    files[f"{iio}/name"] = "ina3221x"
    for c, (label, mv, ma, mw) in enumerate(XAVIER_NX_JP4_RAILS):
        files[f"{iio}/rail_name_{c}"] = label
        files[f"{iio}/in_voltage{c}_input"] = mv
        files[f"{iio}/in_current{c}_input"] = ma
        files[f"{iio}/in_power{c}_input"] = mw
        files[f"{iio}/crit_current_limit_{c}"] = 3000
        files[f"{iio}/warn_current_limit_{c}"] = "32760 ma" if c else 6000
    write_tree(root, files)
    _link(root, "sys/bus/i2c/drivers/ina3221x/7-0040", dev_rel)
    _jetson_files(root, "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t186ref, EABI: aarch64",
                  "NVIDIA Jetson Xavier NX Developer Kit", XAVIER_NX_NVPMODEL_CONF, 2)
    tegrastats_script(root, XAVIER_NX_JP4_LINE)
    return root


def agx_orin(root: Path) -> Path:
    """AGX Orin: two INA3221s, no input rail (rail names from NVIDIA's guide; readings as posted from a
    loaded AGX Orin). Unconnected channels are labelled NC on some releases and have no label on others."""
    ina3221_hwmon(root, "bus@0/c240000.i2c/i2c-1", "1-0040", "hwmon3",
                  [("VDD_GPU_SOC", 843, 6170), ("VDD_CPU_CV", 780, 3437), ("VIN_SYS_5V0", 4968, 953)])
    second = ina3221_hwmon(root, "bus@0/c240000.i2c/i2c-1", "1-0041", "hwmon4",
                           [("NC", 0, 0), ("VDDQ_VDD2_1V8AO", 1800, 341), ("NC", 0, 0)])
    (second / "in3_label").unlink()
    return root


def ina238_thor(root: Path) -> Path:
    """An INA238 under the mainline hwmon driver, as Jetson Thor measures its input (address illustrative)."""
    dev_rel = "sys/devices/platform/bus@0/c240000.i2c/i2c-2/2-0044"
    h = f"{dev_rel}/hwmon/hwmon3"
    write_tree(root, {
        f"{dev_rel}/name": "ina238",
        f"{h}/name": "ina238",
        f"{h}/in0_input": 12,  # shunt, mV
        f"{h}/in1_input": 19980,  # bus, mV
        f"{h}/curr1_input": 2503,  # mA
        f"{h}/power1_input": 50010000,  # uW
        f"{h}/temp1_input": 41250,
    })
    _link(root, "sys/bus/i2c/drivers/ina238/2-0044", dev_rel)
    return root


def rapl(root: Path, package_uj: int = 1000, max_uj: int = 262143328850) -> Path:
    """x86 RAPL: package-0 with core and dram sub-zones; /sys/class/powercap entries are symlinks."""
    base = "sys/devices/virtual/powercap/intel-rapl"
    pkg = f"{base}/intel-rapl:0"
    write_tree(root, {
        f"{pkg}/name": "package-0", f"{pkg}/energy_uj": package_uj, f"{pkg}/max_energy_range_uj": max_uj,
        f"{pkg}/intel-rapl:0:0/name": "core", f"{pkg}/intel-rapl:0:0/energy_uj": 10,
        f"{pkg}/intel-rapl:0:0/max_energy_range_uj": max_uj,
        f"{pkg}/intel-rapl:0:1/name": "dram", f"{pkg}/intel-rapl:0:1/energy_uj": 20,
        f"{pkg}/intel-rapl:0:1/max_energy_range_uj": 65712999613,
    })
    _link(root, "sys/class/powercap/intel-rapl:0", pkg)
    _link(root, "sys/class/powercap/intel-rapl:0:0", f"{pkg}/intel-rapl:0:0")
    _link(root, "sys/class/powercap/intel-rapl:0:1", f"{pkg}/intel-rapl:0:1")
    return root
