"""``edgert power`` through the real CLI in a subprocess, on fake board roots and on an empty one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgert.power import nvpmodel
from tests.helpers import assert_one_line_error, run_cli
from tests.power import boards


def _env(root: Path) -> dict[str, str]:
    return {"EDGERT_SYSROOT": str(root)}


def test_no_meter_says_so_in_one_line(tmp_path: Path) -> None:
    result = run_cli("power", env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("no power meter on this machine:")
    assert "Traceback" not in result.stderr


def test_no_meter_json(tmp_path: Path) -> None:
    result = run_cli("power", "--json", env=_env(tmp_path))
    data = json.loads(result.stdout)
    assert data["available"] is False and data["meter"] is None and "ina:" in data["reason"]


def test_orin_nano_rails_and_power_mode(tmp_path: Path) -> None:
    boards.orin_nano_jp6(tmp_path)
    result = run_cli("power", env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ina3221 1-0040" in out
    assert "VDD_IN" in out and "4.968 W" in out and "(total)" in out
    assert "VDD_CPU_GPU_CV" in out and "VDD_SOC" in out
    assert "power mode   MAXN_SUPER (2); clocks locked: no; modes: 0=15W, 1=7W, 2=MAXN_SUPER" in out


def test_json_reading(tmp_path: Path) -> None:
    boards.xavier_nx_jp4(tmp_path)
    result = run_cli("power", "--json", env=_env(tmp_path))
    data = json.loads(result.stdout)
    assert data["meter"] == "ina" and data["total_rails"] == ["VDD_IN"]
    assert data["reading"]["rails"]["VDD_IN"]["watts"] == 4.067
    assert data["reading"]["total_w"] == 4.067
    assert data["power_mode"]["mode"] == "MODE_15W_6CORE"


def test_watch_prints_a_line_per_reading(tmp_path: Path) -> None:
    boards.orin_nano_jp6(tmp_path)
    result = run_cli("power", "--watch", "--count", "3", "--interval", "0.05", env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("meter")
    assert len(lines) == 4 and all("total 4.968 W" in line for line in lines[1:])
    js = run_cli("power", "--watch", "--json", "--count", "2", "--interval", "0.05", env=_env(tmp_path))
    rows = [json.loads(line) for line in js.stdout.strip().splitlines()]
    assert len(rows) == 2 and rows[0]["total_w"] == 4.968


def test_tegrastats_meter_by_name(tmp_path: Path) -> None:
    boards.xavier_nx_jp5(tmp_path)
    result = run_cli("power", "--meter", "tegrastats", env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "tegrastats" in result.stdout and "5.079 W" in result.stdout


def test_named_meter_missing_is_a_one_line_error(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("power", "--meter", "ina", env=_env(tmp_path)), "INA3221")
    assert_one_line_error(run_cli("power", "--meter", "rapl", env=_env(tmp_path)), "RAPL")
    assert_one_line_error(run_cli("power", "--interval", "0", "--watch", env=_env(tmp_path)), "--interval")


def test_set_mode_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    boards.orin_nano_jp6(tmp_path)
    # mode 9 is not defined; a real mode needs nvpmodel and root, neither of which is here
    assert_one_line_error(run_cli("power", "--set-mode", "9", env=_env(tmp_path)), "not defined", "0 (15W)")
    result = run_cli("power", "--set-mode", "1", env=_env(tmp_path))
    assert_one_line_error(result)
    assert "nvpmodel not found" in result.stderr or "needs root" in result.stderr


def test_help_works() -> None:
    result = run_cli("power", "--help")
    assert result.returncode == 0 and "--power" not in result.stderr and "--meter" in result.stdout


def test_nvpmodel_parsing() -> None:
    modes, default = nvpmodel.parse_conf(boards.ORIN_NANO_NVPMODEL_CONF)
    assert [(m.id, m.name) for m in modes] == [(0, "15W"), (1, "7W"), (2, "MAXN_SUPER")]
    assert default == 2
    assert nvpmodel.parse_conf("< POWER_MODEL NAME=MAXN ID=3 >") == ([nvpmodel.PowerMode(3, "MAXN")], None)
    assert nvpmodel.parse_query("NV Power Mode: MAXN_SUPER\n2\n") == ("MAXN_SUPER", 2)
    assert nvpmodel.parse_query("NVPM WARN: ...\nNV Power Mode: 15W\n0") == ("15W", 0)
    assert nvpmodel.parse_query("nothing") == (None, None)


def test_nvpmodel_status_and_locked_clocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boards.orin_nano_jp6(tmp_path)
    monkeypatch.setenv("EDGERT_SYSROOT", str(tmp_path))
    st = nvpmodel.status()
    assert (st["mode_id"], st["mode"], st["default_id"], st["clocks_locked"]) == (2, "MAXN_SUPER", 2, False)
    (tmp_path / "sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq").write_text("1510400\n")
    assert nvpmodel.clocks_locked() is True
    monkeypatch.setenv("EDGERT_SYSROOT", str(tmp_path / "empty"))
    st = nvpmodel.status()
    assert st["mode_id"] is None and st["clocks_locked"] is None and "not a Jetson" in st["why"]
