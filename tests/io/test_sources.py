"""Frame sources: files deliver every frame, live sources keep the newest and reconnect, URIs route."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgert.config import SourceConfig
from edgert.errors import SourceError
from edgert.io.sources import (
    ImageFilesSource,
    LiveSource,
    VideoFileSource,
    csi_pipeline,
    gstreamer_available,
    open_source,
    rtsp_pipeline,
)
from tests.pipeline.media import corrupt_avi_frame, make_video

cv2 = pytest.importorskip("cv2")


def _drain(source: object, reuse: bool = True) -> tuple[list[np.ndarray], set[int]]:
    frames, ids, out = [], set(), None
    while True:
        frame = source.read(out)  # type: ignore[attr-defined]
        if frame is None:
            return frames, ids
        ids.add(id(frame))
        frames.append(frame.copy())
        if reuse:
            out = frame


# -- GStreamer pipeline strings (no GStreamer needed) ---------------------------------------------


def test_csi_pipeline_string() -> None:
    p = csi_pipeline(1, 1920, 1080, 30, sensor_mode=2, flip=2)
    assert p.startswith("nvarguscamerasrc sensor-id=1 sensor-mode=2 ! ")
    assert "video/x-raw(memory:NVMM), width=(int)1920, height=(int)1080, framerate=(fraction)30/1" in p
    assert "nvvidconv flip-method=2 ! video/x-raw, width=(int)1920, height=(int)1080, format=(string)BGRx" in p
    assert p.endswith("videoconvert ! video/x-raw, format=(string)BGR ! appsink drop=true max-buffers=1 sync=false")
    assert "sensor-mode" not in csi_pipeline(0)
    assert "framerate=(fraction)30000/1001" in csi_pipeline(0, fps=29.97)


def test_rtsp_pipeline_strings() -> None:
    uri = "rtsp://10.0.0.2:8554/cam"
    desktop = rtsp_pipeline(uri, latency_ms=100)
    assert desktop.startswith(f"rtspsrc location={uri} latency=100 drop-on-latency=true ! decodebin ! ")
    assert desktop.endswith("appsink drop=true max-buffers=1 sync=false")
    jetson = rtsp_pipeline(uri, jetson=True, codec="h265")
    assert "rtph265depay ! h265parse ! nvv4l2decoder ! nvvidconv ! video/x-raw, format=(string)BGRx" in jetson
    assert "rtph264depay ! h264parse ! nvv4l2decoder" in rtsp_pipeline(uri, jetson=True)


# -- URI routing ----------------------------------------------------------------------------------


def test_uri_routing(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=3)
    cv2.imwrite(str(tmp_path / "a.jpg"), np.zeros((8, 8, 3), np.uint8))
    assert isinstance(open_source(str(video)), VideoFileSource)
    assert isinstance(open_source(f"file://{video}"), VideoFileSource)
    assert isinstance(open_source(str(tmp_path / "a.jpg")), ImageFilesSource)
    assert isinstance(open_source(str(tmp_path)), ImageFilesSource)
    assert isinstance(open_source(str(tmp_path / "*.jpg")), ImageFilesSource)
    assert isinstance(open_source("rtsp://127.0.0.1:1/none"), LiveSource)


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("", "no source given"),
        ("/dev/video97", "no such camera device"),
        ("v4l2:///dev/video97", "no such camera device"),
        ("csi://x", "csi://N"),
        ("gst://videotestsrc ! fakesink", "must end in appsink"),
        ("missing-*.jpg", "no image files match"),
        ("missing.jpg", "image file not found"),
    ],
)
def test_bad_uris_are_one_line_source_errors(uri: str, needle: str) -> None:
    with pytest.raises(SourceError, match=needle) as info:
        open_source(uri)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(gstreamer_available(), reason="this OpenCV has GStreamer")
@pytest.mark.parametrize("uri", ["csi://0", "gst://videotestsrc ! videoconvert ! appsink"])
def test_gstreamer_sources_need_gstreamer(uri: str) -> None:
    with pytest.raises(SourceError, match="GStreamer"):
        open_source(uri)


def test_missing_and_garbage_videos(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not found"), open_source(str(tmp_path / "nope.mp4")):
        pass
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 255, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(SourceError, match=r"cannot open as a video|no frame could be decoded") as info, \
            open_source(str(garbage)):
        pass
    assert "\n" not in str(info.value)


# -- files ----------------------------------------------------------------------------------------


def test_video_file_delivers_every_frame_into_reused_buffers(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=24, size=(96, 64), fps=12)
    with open_source(str(video)) as source:
        assert (source.width, source.height, source.fps, source.live) == (96, 64, 12.0, False)
        frames, ids = _drain(source)
    assert len(frames) == 24
    levels = [int(np.median(f)) for f in frames]
    assert levels == sorted(levels) and levels[0] < 4 < levels[-1]  # in order, none repeated or lost
    assert len(ids) <= 2  # the first frame, then every later frame decoded into the caller's buffer


def test_corrupt_frame_is_a_counted_skip(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=20)
    bad = corrupt_avi_frame(video, tmp_path / "bad.avi", frame=10)
    with open_source(str(bad)) as source:
        frames, _ = _drain(source)
        assert source.skipped == 1
    assert len(frames) == 19


def test_loop_restarts_the_video(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=5)
    with open_source(SourceConfig(uri=str(video), loop=True)) as source:
        got = [source.read() is not None for _ in range(12)]
    assert all(got)


def test_image_folder_skips_unreadable_images(tmp_path: Path) -> None:
    for i, shape in enumerate([(40, 60), (30, 30), (50, 20)]):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), np.full((*shape, 3), 50 * i, np.uint8))
    (tmp_path / "img1b.jpg").write_bytes(b"not a jpeg at all")
    (tmp_path / "notes.txt").write_text("ignored")
    with open_source(str(tmp_path)) as source:
        frames, _ = _drain(source)
        assert source.skipped == 1
        assert (source.width, source.height) == (60, 40)  # the first image's size
    assert [f.shape[:2] for f in frames] == [(40, 60), (30, 30), (50, 20)]


# -- live sources: a real camera stand-in (a video file read as a stream) -------------------------


def _file_camera(video: Path) -> LiveSource:
    return LiveSource(f"fake-live:{video.name}", lambda: cv2.VideoCapture(str(video)), backoff=0.02, max_backoff=0.05)


def test_live_source_keeps_the_newest_frame_and_counts_stale_ones(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=200)
    with _file_camera(video) as source:
        assert source.live and (source.width, source.height) == (96, 64)
        times = []  # each frame's capture clock (frame_time): what the pipeline's analytics run on
        out = None
        for _ in range(6):
            time.sleep(0.05)  # a slow consumer: the grabber meanwhile decodes many frames
            frame = source.read(out)
            assert frame is not None
            out = frame
            times.append(source.frame_time)
        assert source.dropped > 0  # the frames replaced before a read: the summary's stale_frames
        assert all(t is not None for t in times)
        assert all(b > a for a, b in zip(times, times[1:]))  # every read a frame that arrived after the last one


def test_live_source_reconnects_with_backoff_and_logs_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    video = make_video(tmp_path / "v.avi", frames=5)  # ends fast: each end is a lost stream
    caplog.set_level(logging.WARNING, logger="edgert.io.sources")
    with _file_camera(video) as source:
        got = 0
        deadline = time.monotonic() + 10
        while source.reconnects < 2 and time.monotonic() < deadline:
            if source.read() is not None:
                got += 1
        assert source.reconnects >= 2
        assert got > 5  # frames kept coming after the reconnects
    text = caplog.text
    assert "stream stopped delivering frames" in text and "reconnecting in" in text and "reconnected" in text


def test_live_source_stop_unblocks_a_waiting_read(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=3)
    source = LiveSource("dead-camera", lambda: cv2.VideoCapture(str(video)), backoff=5.0)
    with source:
        results: list[bool] = []

        def reader() -> None:  # reads until the source says it has ended
            while source.read() is not None:
                results.append(True)
            results.append(False)

        thread = threading.Thread(target=reader)
        thread.start()
        time.sleep(0.5)  # the 3 frames are gone, the grabber waits 5 s to reconnect, read() blocks
        assert thread.is_alive()
        source.stop()
        thread.join(2.0)
        assert not thread.is_alive() and results[-1] is False


def test_unreachable_live_source_is_one_line_error() -> None:
    with pytest.raises(SourceError, match="cannot open") as info, \
            LiveSource("rtsp://nowhere", lambda: cv2.VideoCapture("/nonexistent/stream.mp4")):
        pass
    assert "\n" not in str(info.value)
