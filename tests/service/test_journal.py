"""Priority prefixes for journald, only when stderr really is the journal stream systemd set up."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from edgert.service.journal import JournalFormatter, stderr_is_journal

ROOT = Path(__file__).resolve().parents[2]


def _run_with_stderr_as_journal(tmp_path: Path, *args: str) -> tuple[int, str]:
    """Run the CLI with stderr on a file and JOURNAL_STREAM naming that file, as systemd names its stream."""
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as f:
        st = os.fstat(f.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        proc = subprocess.run([sys.executable, "-m", "edgert.cli.main", *args], stdout=subprocess.DEVNULL,
                              stderr=f, env=env, cwd=ROOT, timeout=120)
    return proc.returncode, err.read_text()


def test_cli_lines_carry_priorities_under_the_journal(tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    config.write_text("model:\n  path: /nowhere/m.onnx\nsource:\n  uri: /dev/video0\n")
    code, err = _run_with_stderr_as_journal(tmp_path, "service", "install", "--config", str(config),
                                            "--name", "cam", "--dry-run", "--edgert", "/bin/true")
    assert code == 0
    assert err.startswith("<4>WARNING edgert.service.install: model /nowhere/m.onnx does not exist"), err
    code, err = _run_with_stderr_as_journal(tmp_path, "service", "install", "--config", str(tmp_path / "no.yaml"),
                                            "--name", "cam", "--dry-run")
    assert code == 1 and err.startswith("<3>edgert: error: ") and err.count("\n") == 1, err


def test_an_inherited_journal_stream_is_not_ours(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "edgert.cli.main", "service", "status", "--name", "nothing",
                           "--unit-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "JOURNAL_STREAM": "1:2"})
    assert proc.returncode == 1 and proc.stderr.startswith("edgert: error: ")
    assert not stderr_is_journal({"JOURNAL_STREAM": "garbage"})
    assert not stderr_is_journal({})


def test_every_line_of_a_traceback_gets_the_prefix() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("edgert.x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    lines = JournalFormatter("%(levelname)s %(name)s: %(message)s").format(record).split("\n")
    assert lines[0] == "<3>ERROR edgert.x: failed" and len(lines) > 3
    assert all(line.startswith("<3>") for line in lines)
