"""`edgert run` as systemd runs it: a real notify socket, WATCHDOG_USEC, SIGTERM, a stalled source, /metrics.

The pipeline is a real ONNX detector (tiny, built in the test) on real MJPG videos written with OpenCV.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline.media import make_video, tiny_detector
from tests.service.conftest import NotifyReceiver

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("cv2", reason="the video source needs OpenCV (pip install 'edgert[opencv]')")
pytest.importorskip("onnxruntime", reason="the pipeline runs on ONNX Runtime (pip install 'edgert[cpu]')")
parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is in the test extra")

WATCHDOG_S = 1.0  # pings expected every 0.5 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, source: Path, loop: bool) -> tuple[Path, Path]:
    model = tiny_detector(tmp_path / "tiny.onnx", size=32)
    out = tmp_path / "detections.jsonl"
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"model:\n  path: {model}\n  backend: onnxruntime\n"
        f"source:\n  uri: {source}\n  loop: {'true' if loop else 'false'}\n"
        f"sinks: ['jsonl://{out}']\n")
    return config, out


@pytest.fixture
def launch(path_receiver: NotifyReceiver) -> Iterator:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        env = {**os.environ, "NOTIFY_SOCKET": path_receiver.address,
               "WATCHDOG_USEC": str(int(WATCHDOG_S * 1_000_000)), "PYTHONUNBUFFERED": "1"}
        env.pop("WATCHDOG_PID", None)
        proc = subprocess.Popen([sys.executable, "-m", "edgert.cli.main", "run", *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def _jsonl_complete(path: Path) -> int:
    text = path.read_text()
    assert text.endswith("\n"), "the last JSON line is partial"
    lines = text.splitlines()
    for line in lines:
        json.loads(line)
    return len(lines)


def test_ready_watchdog_status_then_stopping_on_sigterm(tmp_path: Path, launch, path_receiver: NotifyReceiver) -> None:
    video = make_video(tmp_path / "clip.avi", frames=40, size=(96, 64), fps=10)
    config, out = _config(tmp_path, video, loop=True)
    port = _free_port()
    proc = launch("--config", str(config), "--metrics", f"127.0.0.1:{port}")
    ready = path_receiver.wait_for("READY", timeout=90)
    assert "first frame through" in ready[0][1]["STATUS"]
    pings = path_receiver.wait_for("WATCHDOG", count=5, timeout=30)  # READY's ping, then 4 from progress
    assert all("fps" in m.get("STATUS", "") for _, m in pings[1:])

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        fams = {f.name: f for f in parser.text_string_to_metric_families(resp.read().decode())}
    assert fams["edgert_ready"].samples[0].value == 1
    assert fams["edgert_frames"].samples[0].value > 0
    assert fams["edgert_info"].samples[0].labels["backend"] == "onnxruntime"

    sent_term = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    stopping = path_receiver.wait_for("STOPPING", timeout=5)
    assert stopping[0][0] >= sent_term
    # STOPPING=1 goes out when the stop is requested, before the sinks flush (not after, from on_stop).
    assert stopping[0][1].get("STATUS", "").startswith("stopping (SIGTERM)"), stopping
    # Pings follow the pipeline's progress, rate-limited: never closer than half the period.
    # (receipt times, so allow for scheduling jitter; per-frame pings would come milliseconds apart)
    times = [t for t, _ in path_receiver.with_key("WATCHDOG")]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps and min(gaps) > WATCHDOG_S / 4, gaps
    assert len(times) <= (times[-1] - times[0]) / (WATCHDOG_S / 2) + 2
    assert _jsonl_complete(out) > 0
    assert "SIGTERM" in stdout or "SIGTERM" in stderr  # the summary says what stopped it


def test_a_source_that_stops_delivering_stops_the_pings(tmp_path: Path, launch,
                                                        path_receiver: NotifyReceiver) -> None:
    """A live feed through a FIFO: the test writes part of a video, then holds the pipe open and silent."""
    data = make_video(tmp_path / "clip.avi", frames=200, size=(96, 64), fps=20).read_bytes()
    fifo = tmp_path / "live.avi"
    os.mkfifo(fifo)
    config, out = _config(tmp_path, fifo, loop=False)
    stall = threading.Event()
    resume = threading.Event()
    chunk = len(data) // 40

    def feed() -> None:
        with open(fifo, "wb") as pipe:
            # About 2.5 s of live video in small writes, then silence with the pipe still open.
            for i in range(0, len(data) // 2, chunk):
                pipe.write(data[i:i + chunk])
                pipe.flush()
                time.sleep(0.125)
            stall.set()
            resume.wait(30)
            pipe.write(data[len(data) // 2:])

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    proc = launch("--config", str(config))
    try:
        path_receiver.wait_for("READY", timeout=90)
        path_receiver.wait_for("WATCHDOG", count=3, timeout=30)
        assert stall.wait(30)
        time.sleep(1.5)  # the frames already in the pipe go through
        settled = len(path_receiver.with_key("WATCHDOG"))
        time.sleep(3 * WATCHDOG_S)  # three watchdog periods: systemd would have restarted it
        assert proc.poll() is None, "the pipeline should hang on its silent source, not exit"
        assert len(path_receiver.with_key("WATCHDOG")) == settled, "WATCHDOG=1 sent while no frame came through"
    finally:
        resume.set()
    _, stderr = proc.communicate(timeout=60)  # the rest of the video, then end of input
    assert proc.returncode == 0, stderr
    assert len(path_receiver.with_key("WATCHDOG")) > settled  # pings came back with the frames
    assert _jsonl_complete(out) > 0
