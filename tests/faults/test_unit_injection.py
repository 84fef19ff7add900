"""A unit file nobody can write into: every value is checked, quoted, and the unit read back before it is written.

A newline in a source URI, the model path, ``--config``, ``--user`` or ``--edgert`` used to become new lines of the
unit (a ``[Service]`` section with any ``ExecStartPre=``, accepted by ``systemd-analyze verify``). Each is now
refused in one line naming the field; values that are odd but legal on one line (blanks, quotes, ``%``, ``$``,
``;``, backslashes) are quoted so that systemd reads back exactly the argument meant, which the test checks with
edgert's reader and with ``systemd-analyze verify`` where it is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgert.service.unit_check import parse_unit, split_exec
from tests.helpers import assert_one_line_error, run_cli
from tests.service.test_unit import verify

INJECT = "\n[Service]\nExecStartPre=/bin/touch /tmp/edgert-pwned\n"


def _config(folder: Path, model: str, uri: str = "rtsp://${CAM_HOST}/stream", name: str = "p.yaml") -> Path:
    cfg = folder / name
    cfg.write_text(yaml.safe_dump({"model": {"path": model, "backend": "onnxruntime"}, "source": {"uri": uri}}),
                   encoding="utf-8")
    return cfg


def _install(cfg: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli("service", "install", "--config", str(cfg), "--name", "cam", "--dry-run", *flags)


@pytest.mark.parametrize(("where", "field"), [
    ("source", "source.uri"), ("model", "model.path"), ("config", "--config"), ("user", "--user"),
    ("edgert", "--edgert"), ("metrics", "--metrics"), ("env", "--env-file"),
])
def test_a_newline_anywhere_is_refused_in_one_line(tmp_path: Path, media: dict[str, Path], where: str,
                                                   field: str) -> None:
    model = str(media["model"])
    flags: list[str] = []
    cfg = _config(tmp_path, model)
    if where == "source":
        cfg = _config(tmp_path, model, uri="rtsp://cam/stream" + INJECT)
    elif where == "model":
        cfg = _config(tmp_path, "/opt/m" + INJECT + "x.onnx")
    elif where == "config":
        cfg = _config(tmp_path, model, name="p" + INJECT.replace("/", "_") + ".yaml")
    elif where == "user":
        flags = ["--user", "edgert" + INJECT]
    elif where == "edgert":
        flags = ["--edgert", "/opt/edgert" + INJECT + "edgert"]
    elif where == "metrics":
        flags = ["--metrics", "127.0.0.1:9400" + INJECT]
    elif where == "env":
        flags = ["--env-file", "/etc/edgert/cam.env" + INJECT]
    refused = _install(cfg, *flags)
    assert_one_line_error(refused, field)
    assert "ExecStartPre=/bin/touch" not in refused.stdout


def test_a_trailing_backslash_cannot_join_lines(tmp_path: Path, media: dict[str, Path]) -> None:
    refused = _install(_config(tmp_path, str(media["model"])), "--env-file", "/etc/edgert/cam.env\\")
    assert_one_line_error(refused, "--env-file")


def test_odd_but_legal_values_are_quoted_and_read_back_as_meant(tmp_path: Path, media: dict[str, Path]) -> None:
    real = Path(sys.prefix) / "bin" / "edgert"
    if not real.exists():
        pytest.skip("the edgert command is not installed in this environment (pip install -e .)")
    odd = tmp_path / "it's a \"dir\" of 100% $HOME; \\ and more"
    odd.mkdir()
    bin_dir = tmp_path / "bin 100% $HOME;"  # systemd itself refuses quotes and backslashes in an executable's path
    bin_dir.mkdir()
    edgert = bin_dir / "edgert"
    os.symlink(real, edgert)
    quoted = odd / "edgert"
    os.symlink(real, quoted)
    assert_one_line_error(_install(_config(odd, str(media["model"])), "--edgert", str(quoted)), "--edgert")
    cfg = _config(odd, str(media["model"]), uri="rtsp://${CAM_HOST}/stream?x=50%25&y=$z", name="p %n $X;.yaml")
    made = _install(cfg, "--edgert", str(edgert), "--metrics", "127.0.0.1:9400")
    assert made.returncode == 0, made.stderr
    settings = parse_unit(made.stdout)
    exec_start = [split_exec(v) for _, k, v in settings if k == "ExecStart"]
    assert exec_start == [[str(edgert), "run", "--config", str(cfg), "--metrics", "127.0.0.1:9400"]]
    sections = [s for s, _, _ in settings]
    assert sections == sorted(sections, key=["Unit", "Service", "Install"].index)  # nothing moved section
    unit = tmp_path / "edgert-cam.service"
    unit.write_text(made.stdout, encoding="utf-8")
    verify(unit)
