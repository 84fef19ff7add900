"""One time base: each frame's media time, from the source (a file's timestamps, a live source's capture
clock), through the pipeline into the analytics and the summary's ``time_base``."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.io.sources import LiveSource, media_time, open_source, time_base
from edgert.pipeline import Pipeline
from edgert.pipeline.preload import PreloadedSource
from tests.pipeline.media import corrupt_avi_frame, make_video, tiny_detector

cv2 = pytest.importorskip("cv2")


def _times(source, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        if source.read() is None:
            break
        out.append(round(source.frame_time, 6))
    return out


def test_a_video_file_stamps_each_frame_with_its_own_time(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=12, fps=4.0)
    with open_source(str(video)) as source:
        assert time_base(source) == "media"
        assert _times(source, 20) == [i / 4.0 for i in range(12)]
    # looped: the second pass goes on counting, as the video would if it were twice as long
    with open_source(SourceConfig(uri=str(video), loop=True)) as source:
        assert _times(source, 30) == [i / 4.0 for i in range(30)]
    # a frame that does not decode keeps its slot: the next one is still at its own time
    damaged = corrupt_avi_frame(video, tmp_path / "d.avi", 5)
    with open_source(str(damaged)) as source:
        times = _times(source, 20)
    assert len(times) == 11 and 5 / 4.0 not in times and times[5:] == [i / 4.0 for i in range(6, 12)]


def test_preloaded_and_looped_frames_keep_their_times(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=5, fps=10.0)
    with PreloadedSource(open_source(str(video)), loop=True, limit=None) as source:
        assert _times(source, 12) == [round(i / 10.0, 6) for i in range(12)]


def test_a_live_source_runs_on_the_capture_clock(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=30)
    camera = LiveSource("file-camera", lambda: cv2.VideoCapture(str(video)), backoff=0.01)
    before = time.time()
    with camera:
        assert time_base(camera) == "capture clock"
        assert camera.read() is not None
        stamp = camera.frame_time
    assert stamp is not None and before <= stamp <= time.time()
    assert media_time(camera, 3, 123.0) == stamp  # the source's own stamp wins over the pipeline's clock


def test_objects_without_a_clock_count_frames() -> None:
    class Files:
        live = False
        fps = 20.0

    class Camera:
        live = True

    assert media_time(Files(), 10, 999.0) == 0.5 and time_base(Files()) == "media"
    assert media_time(Camera(), 10, 999.0) == 999.0 and time_base(Camera()) == "capture clock"


def test_the_summary_says_which_time_base(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    video = make_video(tmp_path / "v.avi", frames=8)
    model = tiny_detector(tmp_path / "tiny.onnx")
    config = PipelineConfig(model=ModelConfig(path=str(model)), source=SourceConfig(uri=str(video)))
    summary = Pipeline(config, handle_signals=False).run()
    assert summary["time_base"] == "media" and summary["sources"][0]["time_base"] == "media"
    assert summary["sources"][0]["media_s"] == 0.7  # 8 frames at 10 fps: first to last, in video time
    camera = LiveSource("file-camera", lambda: cv2.VideoCapture(str(video)), backoff=0.01)
    mixed = Pipeline(dataclasses.replace(config, runtime=RuntimeConfig(max_frames=3)),
                     sources=[open_source(str(video)), camera], handle_signals=False).run()
    assert mixed["time_base"] == {"0": "media", "1": "capture clock"}

