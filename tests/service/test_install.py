"""`edgert service install|status|uninstall` through the real CLI, and `jetson/install.sh --check`."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.service.test_unit import verify

ROOT = Path(__file__).resolve().parents[2]


def _edgert_here() -> str:
    exe = Path(sys.prefix) / "bin" / "edgert"
    if not exe.exists():
        pytest.skip("the edgert command is not installed in this environment (pip install -e .)")
    return str(exe)


def _pipeline(tmp_path: Path) -> Path:
    model = tmp_path / "models" / "m.onnx"
    model.parent.mkdir()
    model.write_bytes(b"not read by install")
    config = tmp_path / "p.yaml"
    config.write_text(f"model:\n  path: {model}\nsource:\n  uri: rtsp://cam/stream\n"
                      f"sinks: ['jsonl://{tmp_path}/out/d.jsonl']\n")
    return config


def test_dry_run_prints_the_unit_and_writes_nothing(tmp_path: Path) -> None:
    config = _pipeline(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = run_cli("service", "install", "--config", str(config), "--name", "door", "--dry-run",
                   "--unit-dir", str(tmp_path / "units"), "--edgert", _edgert_here())
    assert proc.returncode == 0, proc.stderr
    assert "Type=notify" in proc.stdout and f"ExecStart={_edgert_here()} run --config {config}" in proc.stdout
    assert "After=network-online.target" in proc.stdout
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_install_status_uninstall_into_a_unit_dir(tmp_path: Path) -> None:
    config = _pipeline(tmp_path)
    units, env = tmp_path / "units", tmp_path / "etc" / "door.env"
    user = pwd.getpwuid(os.getuid()).pw_name  # an existing user: install must never create one in a test
    proc = run_cli("service", "install", "--config", str(config), "--name", "door", "--user", user,
                   "--unit-dir", str(units), "--env-file", str(env), "--edgert", _edgert_here(),
                   "--metrics", "127.0.0.1:9400")
    assert proc.returncode == 0, proc.stderr
    unit = units / "edgert-door.service"
    assert f"wrote {unit}" in proc.stdout and f"wrote {env}" in proc.stdout
    assert "systemctl daemon-reload && sudo systemctl enable --now edgert-door.service" in proc.stdout
    assert (tmp_path / "out").is_dir()  # the output folder exists for ReadWritePaths
    text = unit.read_text()
    assert f"User={user}" in text and f"EnvironmentFile=-{env}" in text and "--metrics 127.0.0.1:9400" in text
    verify(unit)
    env.write_text("GST_DEBUG=3\n")  # an operator's edit survives a reinstall
    assert run_cli("service", "install", "--config", str(config), "--name", "door", "--user", user,
                   "--unit-dir", str(units), "--env-file", str(env), "--edgert", _edgert_here()).returncode == 0
    assert env.read_text() == "GST_DEBUG=3\n"

    proc = run_cli("service", "status", "--name", "door", "--unit-dir", str(units))
    assert proc.returncode == 0 and "installed at" in proc.stdout
    proc = run_cli("service", "uninstall", "--name", "door", "--unit-dir", str(units))
    assert proc.returncode == 0 and not unit.exists() and env.exists()
    proc = run_cli("service", "status", "--name", "door", "--unit-dir", str(units))
    assert proc.returncode == 1 and "no service named door" in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["install", "--config", "missing.yaml", "--name", "x", "--dry-run"], "config file not found"),
    (["install", "--config", "CONFIG", "--name", "a b", "--dry-run"], "service name 'a b'"),
    (["install", "--config", "CONFIG", "--name", "x", "--dry-run", "--metrics", "9400"], "HOST:PORT"),
    (["install", "--config", "CONFIG", "--name", "x", "--dry-run", "--edgert", "bin/edgert"], "must be absolute"),
    (["install", "--config", "CONFIG", "--name", "x", "--user", "no-such-user-edgert", "--unit-dir", "UNITS",
      "--env-file", "UNITS/x.env", "--edgert", "/bin/true"], None),
    (["uninstall", "--name", "never", "--unit-dir", "UNITS"], "no service named never"),
])
def test_bad_input_is_one_line_exit_1(tmp_path: Path, args: list[str], message: str | None) -> None:
    config = _pipeline(tmp_path)
    relative = tmp_path / "relative.yaml"
    relative.write_text("model:\n  path: models/m.onnx\nsource:\n  uri: /dev/video0\n")
    args = [a.replace("CONFIG", str(config)).replace("UNITS", str(tmp_path / "u")).replace("RELATIVE", str(relative))
            for a in args]
    if "no-such-user-edgert" in args and os.geteuid() == 0:
        pytest.skip("as root, install would create the missing user on this machine")
    proc = run_cli("service", *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith("edgert: error: ")
    assert message is None or message in proc.stderr
    if "no-such-user-edgert" in args:
        assert "does not exist" in proc.stderr


def _tree_state(*roots: Path) -> dict[str, str]:
    state = {}
    for root in roots:
        if not root.exists():
            continue
        for p in [root, *root.rglob("*")]:
            if ".pytest_cache" in p.parts or "__pycache__" in p.parts:
                continue
            st = p.lstat()
            state[str(p)] = f"{st.st_mode}:{st.st_size}:{st.st_mtime_ns}"
    return state


def test_install_sh_check_reports_and_changes_nothing(tmp_path: Path) -> None:
    if shutil.which("bash") is None or shutil.which("dpkg-query") is None:
        pytest.skip("install.sh --check needs bash and dpkg-query (a Debian/Ubuntu system)")
    prefix = tmp_path / "opt-edgert"
    watched = [ROOT / "jetson", tmp_path]
    before = _tree_state(*watched)
    dpkg_status = Path("/var/lib/dpkg/status")
    dpkg_before = hashlib.sha256(dpkg_status.read_bytes()).hexdigest() if dpkg_status.exists() else None
    proc = subprocess.run(["bash", str(ROOT / "jetson" / "install.sh"), "--check", "--prefix", str(prefix)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    out = proc.stdout
    assert "python3-libnvinfer" in out and "gstreamer1.0-plugins-good" in out and "opencv" in out.lower()
    assert f"virtualenv {prefix}/venv" in out
    if proc.returncode == 1:
        assert "missing" in out and "to install them" in out
    assert not prefix.exists()
    assert _tree_state(*watched) == before
    if dpkg_before is not None:
        assert hashlib.sha256(dpkg_status.read_bytes()).hexdigest() == dpkg_before


def test_install_sh_refuses_unknown_options() -> None:
    proc = subprocess.run(["bash", str(ROOT / "jetson" / "install.sh"), "--frobnicate"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "unknown option --frobnicate" in proc.stderr


def test_install_sh_passes_shellcheck() -> None:
    tool = shutil.which("shellcheck")
    if tool is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    proc = subprocess.run([tool, str(ROOT / "jetson" / "install.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
