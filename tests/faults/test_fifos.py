"""FIFOs as a config or a sink never hold a run: no writer (or no reader) is a one-line error, Ctrl-C works.

Before: ``--config FIFO`` with nothing writing to it blocked in ``open`` and ignored Ctrl-C; a JSONL sink on a FIFO
with no reader blocked the run's start, still alive 30 s after SIGTERM. A FIFO with its other end there (a
shell's ``<(...)``) still works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.faults.conftest import start_cli
from tests.helpers import assert_one_line_error, run_cli


def _config_text(media: dict[str, Path], sink: str) -> str:
    return f"model: {{path: {media['model']}}}\nsource: {{uri: '{media['video']}'}}\nsinks: ['{sink}']\n"


def test_a_config_fifo_nothing_writes_to(tmp_path: Path) -> None:
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    refused = run_cli("config", str(fifo), timeout=60)
    assert_one_line_error(refused, "a FIFO nothing writes to")
    proc = start_cli("run", "--config", str(fifo))
    try:
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=5)  # Ctrl-C ends it at once
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("Ctrl-C did not end a run waiting on a config FIFO") from None
    assert proc.returncode != 0


def test_a_config_fifo_with_its_writer_is_read(tmp_path: Path, media: dict[str, Path]) -> None:
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    text = _config_text(media, f"jsonl://{tmp_path}/e.jsonl")

    def write() -> None:
        with open(fifo, "w", encoding="utf-8") as f:  # blocks until the CLI opens it, as a shell's <(...) does
            f.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    shown = run_cli("config", str(fifo), timeout=60)
    writer.join(10)
    assert shown.returncode == 0, shown.stderr
    assert "e.jsonl" in shown.stdout


def test_a_sink_fifo_nothing_reads_from(tmp_path: Path, media: dict[str, Path]) -> None:
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(_config_text(media, f"jsonl://{fifo}"), encoding="utf-8")
    started = time.monotonic()
    refused = run_cli("run", "--config", str(cfg), timeout=60)
    assert_one_line_error(refused, "a FIFO nothing reads from")
    assert time.monotonic() - started < 30
