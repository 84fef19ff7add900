"""Image sinks (the last frame, a folder of frames), the callback sink, and the quick Python path."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgert
from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.errors import InputError, SinkError
from edgert.io.sinks import (
    CallbackSink,
    FrameResult,
    ImageFileSink,
    ImageFolderSink,
    SinkWorker,
    StreamInfo,
    as_sink,
    open_sink,
)
from edgert.vision.detections import Detections
from tests.helpers import assert_one_line_error, run_cli
from tests.pipeline.media import make_video, tiny_detector

cv2 = pytest.importorskip("cv2")

INFO = StreamInfo(96, 64, 10.0, ("person", "car"))
NANODET = "nanodet-m-416-coco-v8layout.onnx"


def _det() -> Detections:
    return Detections(np.array([[10, 12, 40, 50]], np.float32), [0.9], [1], ("person", "car"))


def _frame(level: int) -> np.ndarray:
    return np.full((64, 96, 3), level, np.uint8)


def test_routing_and_options(tmp_path: Path) -> None:
    assert isinstance(open_sink(str(tmp_path / "out.jpg")), ImageFileSink)
    assert isinstance(open_sink(str(tmp_path / "out.png")), ImageFileSink)
    folder = open_sink(f"{tmp_path}/frames/?every=3")
    assert isinstance(folder, ImageFolderSink) and folder.every == 3 and folder.folder == tmp_path / "frames"
    assert isinstance(open_sink(str(tmp_path)), ImageFolderSink)  # an existing folder, without the slash
    assert open_sink(f"{tmp_path}/last.jpg?interval=0").interval == 0  # type: ignore[attr-defined]
    for bad, needle in [(f"{tmp_path}/f/?every=0", "every expects a whole number > 0"),
                        (f"{tmp_path}/f/?evry=2", "unknown option 'evry'"),
                        (f"{tmp_path}/o.jpg?interval=soon", "interval expects a number >= 0")]:
        with pytest.raises(SinkError, match=needle) as info:
            open_sink(bad)
        assert "\n" not in str(info.value)


def test_last_frame_file_is_replaced_whole_and_ends_as_the_last_frame(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "last.jpg"
    sink = ImageFileSink(str(path), path, interval=0)
    sink.open(INFO)
    for level in (10, 200):
        sink.write(FrameResult(level, 0.0, _det(), _frame(level)))
        assert abs(float(cv2.imread(str(path)).mean()) - level) < 3
    sink.write(FrameResult(3, 0.0, _det(), _frame(120)))
    sink.close()
    assert abs(float(cv2.imread(str(path)).mean()) - 120) < 3
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.jpg"]  # no temporary left behind
    slow = ImageFileSink(str(path), path, interval=3600)  # rate-limited: only the first write and the close
    slow.open(INFO)
    for level in (30, 60, 90):
        slow.write(FrameResult(level, 0.0, _det(), _frame(level)))
    assert abs(float(cv2.imread(str(path)).mean()) - 30) < 3
    slow.close()
    assert slow.writes == 2 and abs(float(cv2.imread(str(path)).mean()) - 90) < 3


def test_folder_sink_every_nth_and_source_names(tmp_path: Path) -> None:
    sink = ImageFolderSink("f/", tmp_path / "f", every=2)
    sink.open(INFO)
    for i in range(5):
        sink.write(FrameResult(i, 0.0, _det(), _frame(40 * i)))
    sink.write(FrameResult(6, 0.0, _det(), _frame(0), file="/data/bus.jpg"))
    sink.close()
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == [
        "bus.jpg", "frame_000000.jpg", "frame_000002.jpg", "frame_000004.jpg"]
    assert abs(float(cv2.imread(str(tmp_path / "f" / "frame_000004.jpg")).mean()) - 160) < 3


def test_unwritable_targets_fail_at_open(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for sink in (open_sink(f"{blocker}/out.jpg"), open_sink(f"{blocker}/frames/")):
        with pytest.raises(SinkError) as info:
            sink.open(INFO)
        assert str(blocker) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(SinkError, match=r"cannot write images as \.gif"):
        open_sink(f"{tmp_path}/frames/?format=gif").open(INFO)


def test_callback_sink_gets_every_frame_through_a_pipeline(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    video = make_video(tmp_path / "v.avi", frames=12)
    model = tiny_detector(tmp_path / "tiny.onnx")
    got: list[tuple[int, int, str]] = []
    threads: set[str] = set()
    plotted: list[tuple[int, ...]] = []

    def on_frame(result: FrameResult) -> None:
        got.append((result.index, len(result.detections), result.detections.class_names()[0]))
        threads.add(threading.current_thread().name)
        if result.image is not None:
            plotted.append(result.detections.plot().shape)

    config = PipelineConfig(model=ModelConfig(path=str(model)), source=SourceConfig(uri=str(video)),
                            runtime=RuntimeConfig(queue_size=4))
    summary = edgert.Pipeline(config, sinks=[CallbackSink(on_frame, image=True)], handle_signals=False).run()
    assert [g[0] for g in got] == list(range(12)) and summary["frames"] == 12
    assert all(n == 1 and name == "class0" for _, n, name in got)  # tiny_detector: one box of class 0
    assert plotted == [(64, 96, 3)] * 12
    assert threads == {"edgert-sink:callback://on_frame"}  # its own thread, not the pipeline's


def test_as_sink_takes_uris_sinks_and_functions(tmp_path: Path) -> None:
    sink = as_sink(print)
    assert isinstance(sink, CallbackSink) and sink.uri == "callback://print"
    assert isinstance(as_sink(str(tmp_path / "o.jpg")), ImageFileSink)
    assert as_sink(sink) is sink
    with pytest.raises(SinkError, match="not a sink"):
        as_sink(42)  # type: ignore[arg-type]


def test_failing_callback_stops_that_sink_only() -> None:
    calls: list[int] = []

    def boom(result: FrameResult) -> Any:
        calls.append(result.index)
        raise RuntimeError("application bug")

    worker = SinkWorker(CallbackSink(boom))
    worker.sink.open(INFO)
    worker.start()
    for i in range(3):
        worker.offer(FrameResult(i, 0.0, _det()))
    worker.close()
    assert calls == [0] and isinstance(worker.error, SinkError) and "application bug" in str(worker.error)


# -- the quick Python path on the real model ------------------------------------------------------


def test_top_level_detector_on_a_path_plots_and_saves(assets: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    image = assets / "images" / "bus.jpg"
    with edgert.Detector(assets / "models" / "detection" / NANODET) as det:
        from_path = det(str(image))
        from_array = det(cv2.imread(str(image)))
        assert from_path == from_array and det(image) == from_path
    assert "bus" in from_path.class_names() and "person" in from_path.class_names()
    plotted = from_path.plot()
    original = cv2.imread(str(image))
    assert plotted.shape == original.shape and not np.array_equal(plotted, original)
    assert np.array_equal(from_path.image, original)  # plot drew on a copy
    x1, y1, _, _ = np.rint(from_path.xyxy[0]).astype(int)
    assert tuple(plotted[y1, x1 + 5]) != tuple(original[y1, x1 + 5])  # a box edge is drawn there
    out = from_path.save(tmp_path / "boxes.jpg")
    assert cv2.imread(str(out)).shape == original.shape
    with pytest.raises(InputError, match="image file not found"):
        edgert.Detector(assets / "models" / "detection" / NANODET)(tmp_path / "nope.jpg")
    with pytest.raises(InputError, match="no image to draw on"):
        Detections.empty().plot()


def test_import_edgert_exports_lazily() -> None:
    assert {"Detector", "Pipeline", "CallbackSink", "Detections"} <= set(dir(edgert))
    assert edgert.Detector is __import__("edgert.vision.detector", fromlist=["Detector"]).Detector
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        edgert.Nope  # type: ignore[attr-defined]  # noqa: B018


# -- through the CLI, in a subprocess, on the real model and video --------------------------------


@pytest.mark.slow
def test_run_cli_writes_last_frame_and_a_folder_of_frames(assets: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    last = tmp_path / "out.jpg"
    frames = tmp_path / "frames"
    r = run_cli("run", "--model", str(assets / "models" / "detection" / NANODET),
                "--source", str(assets / "video" / "vtest.avi"), "--max-frames", "5",
                "--sink", str(last), "--sink", f"{frames}/?every=2", "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    video = cv2.VideoCapture(str(assets / "video" / "vtest.avi"))
    ok, first = video.read()
    video.release()
    assert ok
    image = cv2.imread(str(last))
    assert image.shape == first.shape
    assert sorted(p.name for p in frames.iterdir()) == ["frame_000000.jpg", "frame_000002.jpg", "frame_000004.jpg"]
    # annotated: the pedestrians' boxes make the frame differ from the raw video frame
    assert float(np.abs(cv2.imread(str(frames / "frame_000000.jpg")).astype(int) - first).mean()) > 0.5


def test_run_cli_unknown_sink_names_the_image_sinks(tmp_path: Path) -> None:
    model = tiny_detector(tmp_path / "tiny.onnx")
    video = make_video(tmp_path / "v.avi", frames=3)
    r = run_cli("run", "--model", str(model), "--source", str(video), "--sink", str(tmp_path / "out.txt"))
    assert_one_line_error(r, "unknown sink", "out.jpg")
