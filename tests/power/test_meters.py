"""Meters against fake board roots that follow the real sysfs layouts, and recorded tegrastats lines."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from edgert.errors import EdgertError, PowerError
from edgert.power import NullMeter, open_meter
from edgert.power.jetson_ina import JetsonInaMeter, discover_channels, total_rails_for
from edgert.power.rapl import RaplMeter, unwrap
from edgert.power.tegrastats import TegrastatsMeter, parse_rails
from tests.power import boards


@pytest.fixture
def sysroot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("EDGERT_SYSROOT", str(root))
    return root


def _expected(rails: list[tuple[str, int, int]]) -> dict[str, float]:
    return {label: mv * ma / 1e6 for label, mv, ma in rails}


BOARDS = {
    "orin-nano-jp6": (boards.orin_nano_jp6, boards.ORIN_NANO_JP6_LINE, _expected(boards.ORIN_NANO_RAILS)),
    "xavier-nx-jp5": (boards.xavier_nx_jp5, boards.XAVIER_NX_JP5_LINE, _expected(boards.XAVIER_NX_JP5_RAILS)),
    "xavier-nx-jp4": (boards.xavier_nx_jp4, boards.XAVIER_NX_JP4_LINE,
                      {label: mw / 1000 for label, _mv, _ma, mw in boards.XAVIER_NX_JP4_RAILS}),
}


@pytest.mark.parametrize("board", list(BOARDS))
def test_ina_meter_finds_the_rails_of_each_board(board: str, sysroot: Path) -> None:
    build, _line, expected = BOARDS[board]
    build(sysroot)
    with open_meter("ina") as meter:
        assert meter.rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")
        assert meter.total_rails == ("VDD_IN",)
        reading = meter.read()
    assert reading.watts == pytest.approx(expected, abs=1e-9)
    assert reading.total_w == pytest.approx(expected["VDD_IN"])
    assert reading.volts["VDD_IN"] == pytest.approx(5.0, abs=0.2)


@pytest.mark.parametrize("board", list(BOARDS))
def test_recorded_tegrastats_line_gives_the_same_numbers_as_sysfs(board: str, sysroot: Path) -> None:
    build, line, _expected_w = BOARDS[board]
    build(sysroot)
    sysfs = JetsonInaMeter().read().watts
    parsed = parse_rails(line)
    assert list(parsed) == list(sysfs)
    for rail, (now_w, _avg_w) in parsed.items():
        assert now_w == pytest.approx(sysfs[rail], abs=0.0011), rail  # tegrastats rounds to 1 mW


@pytest.mark.parametrize("board", list(BOARDS))
def test_tegrastats_meter_runs_the_program_and_reads_its_lines(board: str, sysroot: Path) -> None:
    build, _line, _expected_w = BOARDS[board]
    build(sysroot)
    sysfs = JetsonInaMeter().read()
    with open_meter("tegrastats") as meter:  # the fake root's usr/bin/tegrastats, a real subprocess
        assert meter.rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")
        assert meter.total_rails == ("VDD_IN",)
        reading = meter.read()
    assert reading.watts == pytest.approx(dict(sysfs.watts), abs=0.0011)
    assert reading.total_w == pytest.approx(sysfs.total_w, abs=0.0011)


def test_tegrastats_formats_of_other_boards() -> None:
    nano = parse_rails(boards.NANO_JP4_LINE)
    assert nano == {"POM_5V_IN": (2.003, 2.003), "POM_5V_GPU": (0.0, 0.0), "POM_5V_CPU": (0.32, 0.32)}
    agx = parse_rails(boards.AGX_XAVIER_JP4_LINE)
    assert list(agx) == ["GPU", "CPU", "SOC", "CV", "VDDRQ", "SYS5V"]
    assert total_rails_for(tuple(agx)) == tuple(agx)  # no input rail: the parts are summed
    assert total_rails_for(tuple(nano)) == ("POM_5V_IN",)
    # RAM/SWAP/IRAM "a/bMB" fields are not rails; a line without rails gives none
    assert parse_rails("RAM 1273/7620MB (lfb 1x4MB) SWAP 286/3810MB (cached 1MB) IRAM 0/252kB(lfb 252kB)") == {}
    assert parse_rails("VDD_IN 5520mW/5400mW")["VDD_IN"] == (5.52, 5.4)


def test_agx_orin_skips_unconnected_channels_and_the_shunt_sum(sysroot: Path) -> None:
    boards.agx_orin(sysroot)
    meter = JetsonInaMeter()
    assert meter.rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")
    # NVIDIA's guide: VDDQ_VDD2_1V8AO is already inside VIN_SYS_5V0
    assert meter.total_rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")
    r = meter.read()
    assert r.total_w == pytest.approx(0.843 * 6.17 + 0.780 * 3.437 + 4.968 * 0.953)
    assert r.watts["VDDQ_VDD2_1V8AO"] == pytest.approx(1.8 * 0.341)


def test_a_disabled_channel_is_left_out(sysroot: Path) -> None:
    hwmon = boards.ina3221_hwmon(sysroot, "bus@0/c240000.i2c/i2c-1", "1-0040", "hwmon1", boards.ORIN_NANO_RAILS)
    (hwmon / "in3_enable").write_text("0\n")
    assert [c.rail for c in discover_channels()] == ["VDD_IN", "VDD_CPU_GPU_CV"]


def test_ina238_gives_microwatts_and_names_the_input_rail(sysroot: Path) -> None:
    boards.ina238_thor(sysroot)
    meter = JetsonInaMeter()
    assert meter.rails == ("VIN",)
    r = meter.read()
    assert r.watts["VIN"] == pytest.approx(50.01)
    assert r.volts["VIN"] == pytest.approx(19.98)
    assert r.amps["VIN"] == pytest.approx(2.503)


def test_ina238_energy_counter_counts_from_open(sysroot: Path) -> None:
    boards.ina238_thor(sysroot)
    energy = next(sysroot.glob("sys/devices/**/hwmon3")) / "energy1_input"
    energy.write_text("5000000\n")  # uJ, as the INA228/INA780 variants report
    meter = JetsonInaMeter()
    assert meter.read().energy_j["VIN"] == 0.0
    energy.write_text("7500000\n")
    assert meter.read().energy_j["VIN"] == pytest.approx(2.5)


def test_a_rail_file_that_vanishes_is_a_power_error(sysroot: Path) -> None:
    boards.orin_nano_jp6(sysroot)
    meter = JetsonInaMeter()
    (meter.channels[1].amps_file or Path("/nonexistent")).unlink()
    with pytest.raises(PowerError, match="VDD_CPU_GPU_CV"):
        meter.read()


def test_rapl_package_power_from_counters_with_wrap_around(sysroot: Path) -> None:
    max_uj = 1_000_000
    boards.rapl(sysroot, package_uj=990_000, max_uj=max_uj)
    pkg = sysroot / "sys/class/powercap/intel-rapl:0/energy_uj"
    meter = RaplMeter()
    assert meter.rails == ("package-0", "package-0/core", "package-0/dram")
    assert meter.total_rails == ("package-0",)
    pkg.write_text("5000\n")  # wrapped: 10_000 + 1 + 5000 uJ later
    r = meter.read()
    assert r.energy_j["package-0"] == pytest.approx((max_uj - 990_000 + 1 + 5000) / 1e6)
    assert r.watts["package-0"] > 0
    assert unwrap(10, 30, 100) == 20
    assert unwrap(90, 5, 100) == 16


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_rapl_readable_by_root_only_says_so(sysroot: Path) -> None:
    boards.rapl(sysroot)
    (sysroot / "sys/class/powercap/intel-rapl:0/energy_uj").chmod(0o200)
    with pytest.raises(PowerError, match="root"):
        RaplMeter()


def test_auto_on_an_empty_root_is_the_null_meter_with_reasons(sysroot: Path) -> None:
    meter = open_meter("auto")
    assert isinstance(meter, NullMeter)
    assert not meter.available
    for name in ("ina", "tegrastats", "nvml", "rapl"):
        assert f"{name}:" in meter.reason
    with pytest.raises(PowerError, match="no power meter"):
        meter.read()


def test_auto_prefers_sysfs_on_a_jetson(sysroot: Path) -> None:
    boards.orin_nano_jp6(sysroot)
    with open_meter("auto") as meter:
        assert meter.kind == "ina"


def test_auto_falls_back_to_tegrastats_when_sysfs_is_missing(sysroot: Path) -> None:
    boards.tegrastats_script(sysroot, boards.ORIN_NANO_JP6_LINE)
    with open_meter("auto") as meter:
        assert meter.kind == "tegrastats"
        assert meter.read().total_w == pytest.approx(4.968)


def test_tegrastats_that_prints_no_rails_is_a_clear_error(tmp_path: Path) -> None:
    script = tmp_path / "silent.py"
    script.write_text("import sys\nprint('RAM 1/2MB', flush=True)\nsys.stderr.write('tegrastats: no power\\n')\n")
    import sys

    with pytest.raises(PowerError, match="no power rails"):
        TegrastatsMeter(command=[sys.executable, str(script)], first_line_timeout_s=3)


def test_named_meter_that_cannot_measure_raises(sysroot: Path) -> None:
    with pytest.raises(PowerError, match="INA3221"):
        open_meter("ina")
    with pytest.raises(PowerError, match="tegrastats not found"):
        open_meter("tegrastats")
    with pytest.raises(PowerError, match="unknown power meter"):
        open_meter("watts")


def test_nvml_without_a_gpu_is_unavailable_with_a_reason() -> None:
    from edgert.platform import gpu_present

    if gpu_present()[0]:
        pytest.skip("a GPU is present: NVML may well work here")
    with pytest.raises(EdgertError, match=r"NVML|nvml|pynvml"):
        open_meter("nvml")


def test_meter_reads_from_several_threads(sysroot: Path) -> None:
    boards.orin_nano_jp6(sysroot)
    meter = JetsonInaMeter()
    errors: list[BaseException] = []

    def read_many() -> None:
        try:
            for _ in range(50):
                assert meter.read().total_w > 0
        except BaseException as exc:  # collected for the main thread
            errors.append(exc)

    threads = [threading.Thread(target=read_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_sysfs_falls_back_to_tegrastats(sysroot: Path) -> None:
    boards.orin_nano_jp6(sysroot)
    for f in sysroot.glob("sys/devices/**/hwmon1/curr*_input"):
        f.chmod(0o200)
    with pytest.raises(PowerError, match="cannot read"):
        JetsonInaMeter()
    with open_meter("auto") as meter:
        assert meter.kind == "tegrastats"


def test_a_rail_that_fails_at_open_is_reported(sysroot: Path) -> None:
    boards.orin_nano_jp6(sysroot)
    (next(sysroot.glob("sys/devices/**/hwmon1")) / "in2_input").write_text("garbage\n")
    with pytest.raises(PowerError, match="VDD_CPU_GPU_CV"):
        JetsonInaMeter()
