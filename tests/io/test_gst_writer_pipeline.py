"""The GStreamer writer's pipeline (JetPack's OpenCV feeds it from ``appsrc``), run for real by the system's
GStreamer through python3-gi with a test source in place of ``appsrc``: the MP4 it writes is fragmented, so a run
killed mid-file leaves a file that plays up to its last fragment. pip's OpenCV has no GStreamer, so what is not run
here is OpenCV's own hand-over into ``appsrc``; ``nvv4l2h264enc`` is Jetson's and is not here either."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from edgert.io.sinks.encoders import gst_pipeline

cv2 = pytest.importorskip("cv2")

SYSTEM_PYTHON = "/usr/bin/python3"
RUN = """
import sys
import gi
gi.require_version("Gst", "1.0")
from gi.repository import Gst
Gst.init(None)
pipeline = Gst.parse_launch(sys.argv[1])
pipeline.set_state(Gst.State.PLAYING)
print("playing", flush=True)
msg = pipeline.get_bus().timed_pop_filtered(120 * Gst.SECOND, Gst.MessageType.EOS | Gst.MessageType.ERROR)
pipeline.set_state(Gst.State.NULL)
sys.exit(0 if msg is not None and msg.type == Gst.MessageType.EOS else 1)
"""


def _gstreamer_with(*elements: str) -> bool:
    probe = ("import gi; gi.require_version('Gst', '1.0'); from gi.repository import Gst; Gst.init(None); "
             f"raise SystemExit(0 if all(Gst.ElementFactory.find(e) for e in {elements!r}) else 1)")
    try:
        return subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(
    not _gstreamer_with("x264enc", "mp4mux", "h264parse", "videoconvert", "videotestsrc"),
    reason="needs the system's GStreamer with x264enc and mp4mux, and python3-gi (apt: gstreamer1.0-plugins-ugly, "
           "gstreamer1.0-plugins-good, python3-gi)")


def _with_test_source(path: Path, source: str) -> str:
    pipeline = gst_pipeline("x264enc", path)
    assert pipeline.startswith("appsrc ! ")
    return pipeline.replace("appsrc ! ", f"{source} ! video/x-raw,width=96,height=64,framerate=30/1 ! ", 1)


def _frames(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    count = 0
    while cap.read()[0]:
        count += 1
    cap.release()
    return count


def test_the_mp4_is_fragmented_and_whole_at_the_end(tmp_path: Path) -> None:
    out = tmp_path / "whole.mp4"
    done = subprocess.run([SYSTEM_PYTHON, "-c", RUN, _with_test_source(out, "videotestsrc num-buffers=150")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"moof" in out.read_bytes()  # fragments, not one index at the end
    assert _frames(out) == 150


def test_a_run_killed_mid_file_leaves_a_file_that_plays(tmp_path: Path) -> None:
    out = tmp_path / "killed.mp4"
    proc = subprocess.Popen([SYSTEM_PYTHON, "-c", RUN, _with_test_source(out, "videotestsrc is-live=true")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "playing"
        time.sleep(5.0)  # 150 frames at 30 fps: two fragments of 2 s are on disk by now
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # an unfragmented MP4 killed here has no moov atom: nothing in it can be decoded
    assert _frames(out) >= 60
