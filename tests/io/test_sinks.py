"""Sinks: JSON Lines, video files, display, RTSP, and the worker that keeps slow sinks from blocking."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from edgert.errors import SinkError
from edgert.io.sinks import (
    DisplaySink,
    FrameResult,
    JsonlSink,
    RtspSink,
    Sink,
    SinkWorker,
    StreamInfo,
    VideoFileSink,
    open_sink,
    rtsp_out_pipeline,
)
from edgert.io.sources import gstreamer_available
from edgert.vision.detections import Detections

cv2 = pytest.importorskip("cv2")

INFO = StreamInfo(96, 64, 10.0, ("person", "car"))


def _det(n: int = 1) -> Detections:
    boxes = np.tile(np.array([[10.0, 12.0, 40.5, 50.25]], np.float32), (n, 1))
    return Detections(boxes, np.full(n, 0.875, np.float32), np.arange(n) % 2, ("person", "car"))


def _frame(i: int) -> np.ndarray:
    return np.full((64, 96, 3), i % 256, np.uint8)


def test_routing_and_unknown_uri(tmp_path: Path) -> None:
    assert isinstance(open_sink(f"jsonl://{tmp_path}/e.jsonl"), JsonlSink)
    assert isinstance(open_sink("jsonl://-"), JsonlSink)
    assert isinstance(open_sink(str(tmp_path / "o.mp4")), VideoFileSink)
    assert isinstance(open_sink(str(tmp_path / "o.avi")), VideoFileSink)
    assert isinstance(open_sink("display://0"), DisplaySink)
    assert isinstance(open_sink("rtsp://127.0.0.1:8554/out"), RtspSink)
    with pytest.raises(SinkError, match="unknown sink") as info:
        open_sink("out.txt")
    assert "valid sinks are" in str(info.value)


def test_jsonl_lines_are_whole_and_flushed_as_written(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "events.jsonl"
    sink = open_sink(f"jsonl://{path}")
    sink.open(INFO)
    for i in range(3):
        sink.write(FrameResult(i, 1700000000.0 + i, _det(i)))
        # Before close: every line written so far is on disk and whole.
        lines = path.read_text().splitlines(keepends=True)
        assert len(lines) == i + 1 and all(line.endswith("\n") for line in lines)
    sink.close()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["frame"] for e in events] == [0, 1, 2]
    assert events[2]["detections"][1] == {
        "box": [10.0, 12.0, 40.5, 50.2],
        "confidence": 0.875,
        "class_id": 1,
        "class_name": "car",
    }
    assert events[0]["detections"] == [] and events[1]["timestamp"] == 1700000001.0


@pytest.mark.parametrize("uri", ["jsonl://{blocker}/events.jsonl", "{blocker}/out.mp4"])
def test_unwritable_paths_fail_at_open(tmp_path: Path, uri: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where a folder should be")
    sink = open_sink(uri.format(blocker=blocker))
    with pytest.raises(SinkError, match="cannot write") as info:
        sink.open(INFO)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("suffix", [".mp4", ".avi"])
def test_video_file_sink_writes_a_readable_video(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"out{suffix}"
    with open_sink(str(path)) as sink:
        sink.open(INFO)
        for i in range(12):
            sink.write(FrameResult(i, 0.0, _det(), _frame(20 * i)))
        sink.write(FrameResult(12, 0.0, _det(), np.zeros((30, 40, 3), np.uint8)))  # another size: resized
    cap = cv2.VideoCapture(str(path))
    count = 0
    while cap.read()[0]:
        count += 1
    assert count == 13
    assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (96, 64)


@pytest.mark.parametrize("size", [(96, 64), (100, 50)])  # 100 wide: the encoder's planes have padded rows
def test_h264_video_keeps_each_frames_colours(tmp_path: Path, size: tuple[int, int]) -> None:
    """The BGR -> YUV 4:2:0 conversion into the writer's one reused frame: every frame's own pixels, in the
    right colours (U and V swapped would turn red into blue), at any row padding."""
    pytest.importorskip("av", reason="H.264 through PyAV (pip install 'edgert[video]')")
    width, height = size
    colours = [(0, 0, 255), (255, 0, 0), (0, 200, 0), (40, 160, 220)]  # BGR: red, blue, green, orange
    frames = []
    for i, colour in enumerate(colours * 3):
        image = np.zeros((height, width, 3), np.uint8)
        image[:] = colour
        image[: height // 2, : width // 2] = (8 * i, 8 * i, 8 * i)  # a grey corner that differs per frame
        frames.append(image)
    path = tmp_path / "colours.mp4"
    with open_sink(str(path)) as sink:
        assert isinstance(sink, VideoFileSink)
        sink.open(StreamInfo(width, height, 10.0, ("person", "car")))
        assert sink.note is not None and "libx264" in sink.note
        for i, image in enumerate(frames):
            sink.write(FrameResult(i, 0.0, _det(0), image))
    cap = cv2.VideoCapture(str(path))
    decoded = []
    while True:
        ok, image = cap.read()
        if not ok:
            break
        decoded.append(image)
    assert len(decoded) == len(frames)
    for original, back in zip(frames, decoded):
        colour = back[height * 3 // 4:, width * 3 // 4:].reshape(-1, 3).mean(axis=0)
        assert np.abs(colour - original[-1, -1]).max() < 12, (colour, original[-1, -1])
        corner = back[2: height // 2 - 2, 2: width // 2 - 2].mean()
        assert abs(corner - original[0, 0, 0]) < 12


def test_display_without_gui_is_a_one_line_error() -> None:
    sink = open_sink("display://0")
    try:
        sink.open(INFO)
    except SinkError as exc:
        assert "\n" not in str(exc) and "http://127.0.0.1:8080" in str(exc)
    else:  # a machine with a GUI OpenCV and a display: the window opened
        sink.close()


@pytest.mark.skipif(gstreamer_available(), reason="this OpenCV has GStreamer")
def test_rtsp_out_without_gstreamer_is_a_one_line_error() -> None:
    with pytest.raises(SinkError, match="GStreamer"):
        open_sink("rtsp://127.0.0.1:8554/out").open(INFO)


@pytest.mark.skipif(not gstreamer_available(), reason="RTSP output needs an OpenCV built with GStreamer")
def test_rtsp_out_of_a_source_not_up_yet_starts_at_its_first_frames_size() -> None:
    """A live source still connecting at start (reconnected in the background) opens its sinks at 0x0: the
    publisher must start at the first frame's size, not at 0x0 (nothing listens on the port: that start fails,
    after the size was taken from the frame)."""
    from tests.faults.conftest import closed_port

    sink = open_sink(f"rtsp://127.0.0.1:{closed_port()}/late")
    assert isinstance(sink, RtspSink)
    sink.open(StreamInfo(0, 0, None, ("person", "car")))  # before the fix: a 0x0 publisher, refused here
    assert sink.size == (0, 0)
    with pytest.raises(SinkError, match="RTSP publisher"):
        sink.write(FrameResult(0, 1700000000.0, _det(), image=_frame(0)))
    assert sink.size == (96, 64)
    sink.close()


def test_rtsp_out_pipeline_strings() -> None:
    desktop = rtsp_out_pipeline("rtsp://h:8554/x", 25.0)
    assert desktop.startswith("appsrc is-live=true ! video/x-raw, format=(string)BGR ! videoconvert")
    assert "x264enc tune=zerolatency" in desktop and "key-int-max=25" in desktop
    assert desktop.endswith("rtspclientsink location=rtsp://h:8554/x")
    assert "nvv4l2h264enc insert-sps-pps=true" in rtsp_out_pipeline("rtsp://h:8554/x", 30.0, jetson=True)


class _SlowSink(Sink):
    """A real sink that takes 30 ms per frame and remembers what it got."""

    needs_image = True

    def __init__(self) -> None:
        super().__init__("slow://")
        self.got: list[tuple[int, int]] = []
        self.closed = False

    def open(self, info: StreamInfo) -> None:
        pass

    def write(self, result: FrameResult) -> None:
        time.sleep(0.03)
        assert result.image is not None
        self.got.append((result.index, int(result.image[0, 0, 0])))

    def close(self) -> None:
        self.closed = True


def test_worker_drops_for_a_slow_sink_without_blocking() -> None:
    sink = _SlowSink()
    worker = SinkWorker(sink)
    worker.start()
    frame = _frame(0)
    started = time.perf_counter()
    for i in range(40):
        frame[:] = i  # the pipeline reuses its buffer at once: the worker must have copied it
        worker.offer(FrameResult(i, 0.0, _det(), frame))
    offered_in = time.perf_counter() - started
    worker.close()
    assert offered_in < 0.2  # 40 offers, never waiting for the 30 ms writes
    assert worker.dropped > 0 and worker.written + worker.dropped == 40
    assert all(index == value for index, value in sink.got)  # each frame kept its own pixels
    assert sink.closed


def test_worker_survives_a_failing_sink() -> None:
    class Broken(_SlowSink):
        def write(self, result: FrameResult) -> None:
            raise OSError("disk full")

    worker = SinkWorker(Broken())
    worker.start()
    for i in range(5):
        worker.offer(FrameResult(i, 0.0, _det(), _frame(i)))
        time.sleep(0.01)
    worker.close()
    assert worker.failed and "disk full" in str(worker.error) and worker.lost == 5 and worker.dropped == 0
