"""``edgert service install`` warns about the paths its own hardening (PrivateTmp, ProtectHome) hides."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.helpers import run_cli


def _script(path: Path, interpreter: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{interpreter}\nimport sys\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _install(config: Path, edgert: Path, tmp_path: Path) -> tuple[int, str, str]:
    r = run_cli("service", "install", "--config", str(config), "--name", "door", "--dry-run",
                "--unit-dir", str(tmp_path / "units"), "--edgert", str(edgert))
    return r.returncode, r.stdout, r.stderr


def test_config_and_interpreter_under_tmp_are_named(tmp_path: Path) -> None:
    if not str(tmp_path).startswith(("/tmp/", "/var/tmp/")):
        pytest.skip(f"the test's temporary folder {tmp_path} is not under /tmp")
    config = tmp_path / "door.yaml"
    config.write_text("model:\n  path: /opt/models/door.onnx\nsource:\n  uri: /dev/video0\n")
    edgert = _script(tmp_path / "venv" / "bin" / "edgert", str(tmp_path / "venv" / "bin" / "python"))
    code, unit, err = _install(config, edgert, tmp_path)
    assert code == 0, err
    assert "PrivateTmp=yes" in unit
    assert f"the config {config} is under /tmp, which PrivateTmp=yes" in err
    assert f"the edgert executable {edgert} is under /tmp" in err
    assert f"the Python interpreter {tmp_path / 'venv' / 'bin' / 'python'} is under /tmp" in err


def test_executable_under_home_is_named_with_protect_home(tmp_path: Path) -> None:
    local = tmp_path / "door.yaml"
    local.write_text("model:\n  path: /opt/models/door.onnx\nsource:\n  uri: /dev/video0\n")
    code, unit, err = _install(local, Path("/home/someone/venv/bin/edgert"), tmp_path)
    assert code == 0, err
    assert "ProtectHome=yes" in unit
    assert "the edgert executable /home/someone/venv/bin/edgert is under /home, which ProtectHome=yes hides" in err


def test_nothing_hidden_no_warning(tmp_path: Path) -> None:
    config = tmp_path / "door.yaml"
    config.write_text("model:\n  path: /opt/models/door.onnx\nsource:\n  uri: /dev/video0\n")
    from edgert.config import load_config
    from edgert.service.unit import UnitOptions, hidden_paths

    opts = UnitOptions(name="door", config_path="/etc/edgert/door.yaml", edgert="/opt/edgert/bin/edgert")
    assert hidden_paths(load_config(config), opts) == []
    csi = load_config(config).__class__(source=load_config(config).source.__class__(uri="csi://0"))
    opts_tmp = UnitOptions(name="door", config_path="/tmp/door.yaml", edgert="/opt/edgert/bin/edgert")
    assert hidden_paths(csi, opts_tmp) == []  # a CSI camera's unit keeps /tmp (PrivateTmp=no): nothing hidden
