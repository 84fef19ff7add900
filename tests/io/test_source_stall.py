"""A source that stops delivering: a FIFO whose writer goes quiet without closing it.

The writer is a real subprocess that writes an MJPG AVI's bytes into a real FIFO and then sleeps holding
it open; ``edgert run`` must end at ``source.timeout_s`` (or at SIGTERM, within a second) with exit 0,
the stall counted in the summary, and whole JSONL lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgert.io.sources import LiveSource
from tests.helpers import ROOT
from tests.pipeline.media import make_video, tiny_detector

cv2 = pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")


@pytest.fixture()
def fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("this platform has no FIFOs")
    path = tmp_path / "camera.fifo"
    os.mkfifo(path)
    return path


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stall")
    return {"video": make_video(root / "v.avi", frames=30, size=(96, 64)), "model": tiny_detector(root / "t.onnx")}


def _quiet_writer(fifo: Path, data_from: Path, fraction: float = 1.0) -> subprocess.Popen[bytes]:
    """Write (part of) a video into ``fifo``, then hold it open and write nothing more."""
    code = ("import sys, time\n"
            "data = open(sys.argv[2], 'rb').read()\n"
            "f = open(sys.argv[1], 'wb')\n"
            "f.write(data[:int(len(data) * float(sys.argv[3]))]); f.flush()\n"
            "time.sleep(300)\n")
    return subprocess.Popen([sys.executable, "-c", code, str(fifo), str(data_from), str(fraction)])


def _whole_lines(path: Path) -> list[dict[str, object]]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.splitlines()]


def _run(media: dict[str, Path], fifo: Path, events: Path, config: Path | None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "edgert.cli.main", "run", "--model", str(media["model"]), "--source", str(fifo),
            "--sink", f"jsonl://{events}", "--json"]
    if config is not None:
        args += ["--config", str(config)]
    return subprocess.Popen(args, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_quiet_fifo_ends_at_the_timeout(media: dict[str, Path], fifo: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("source:\n  timeout_s: 2\n")
    events = tmp_path / "e.jsonl"
    writer = _quiet_writer(fifo, media["video"])
    try:
        started = time.monotonic()
        run = _run(media, fifo, events, config)
        out, err = run.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        writer.kill()
        writer.wait()
    assert run.returncode == 0, err
    summary = json.loads(out)
    assert summary["source"]["stalls"] == 1 and summary["source"]["end_reason"] == "stalled: no frame for 2 s"
    assert "no frame for 2 s" in err
    lines = _whole_lines(events)
    assert len(lines) == summary["frames"] > 0
    assert took < 30  # startup on a loaded machine plus the 2 s wait, not forever


def test_sigterm_ends_a_blocked_read_within_a_second(media: dict[str, Path], fifo: Path, tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    writer = _quiet_writer(fifo, media["video"], fraction=0.5)  # the default 10 s timeout is not reached
    try:
        run = _run(media, fifo, events, None)
        deadline = time.monotonic() + 60
        while not (events.exists() and events.stat().st_size > 0) and time.monotonic() < deadline:
            assert run.poll() is None, run.communicate()
            time.sleep(0.05)
        time.sleep(0.5)  # the reader is now blocked on the quiet FIFO
        sent = time.monotonic()
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        writer.kill()
        writer.wait()
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert took < 1.5, took  # a second, plus process exit on a loaded machine
    summary = json.loads(out)
    assert summary["source"]["stalls"] == 0 and summary["source"]["end_reason"] == "stopped"
    assert len(_whole_lines(events)) == summary["frames"] > 0


class _StuckCapture:
    """A capture whose reads block (as a driver call can) until released by the test."""

    def __init__(self, frames: int, gate: list[bool]) -> None:
        import numpy as np

        self.frames = frames
        self.gate = gate
        self.image = np.zeros((8, 8, 3), np.uint8)
        self.released = False

    def isOpened(self) -> bool:
        return True

    def read(self, out: object = None) -> tuple[bool, object]:
        if self.frames <= 0:
            while not self.gate[0]:
                time.sleep(0.01)
            return False, None
        self.frames -= 1
        time.sleep(0.01)
        return True, self.image.copy()

    def get(self, prop: int) -> float:
        return 0.0

    def release(self) -> None:
        self.released = True


def test_live_stall_is_counted_and_reconnects() -> None:
    gate = [False]
    caps: list[_StuckCapture] = []

    def opener() -> _StuckCapture:
        caps.append(_StuckCapture(3 if not caps else 1000, gate))
        return caps[-1]

    source = LiveSource("stuck-camera", opener, backoff=0.01, max_backoff=0.02, timeout=0.5)
    with source:
        got = 0
        t0 = time.monotonic()
        while got < 10 and time.monotonic() - t0 < 10:
            if source.read() is not None:
                got += 1
        assert got == 10
        assert source.stalls >= 1 and source.reconnects >= 1 and len(caps) >= 2
    gate[0] = True  # the abandoned grabber's stuck read returns; it exits without publishing


def test_live_read_returns_at_stop_while_stalled() -> None:
    import threading

    gate = [False]
    source = LiveSource("quiet-camera", lambda: _StuckCapture(1, gate), backoff=5.0, timeout=30.0)
    with source:
        assert source.read() is not None
        threading.Timer(0.3, source.stop).start()
        t0 = time.monotonic()
        assert source.read() is None
        assert time.monotonic() - t0 < 1.0 and source.end_reason == "stopped"
    gate[0] = True
