"""The threaded runner: buffer reuse, hooks (observers, admission, stop), drops, errors, stats."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.errors import SourceError
from edgert.io.sinks import FrameResult, Sink, StreamInfo
from edgert.io.sources import open_source
from edgert.pipeline import STAGES, BaseObserver, Pipeline, PipelineObserver, PipelineStats
from edgert.pipeline.choice import open_processor
from edgert.stats import LatencyRing
from tests.pipeline.media import VanishingCamera, make_video, tiny_detector

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("media")
    return {
        "video": make_video(root / "v.avi", frames=40, size=(96, 64)),
        "model": tiny_detector(root / "tiny.onnx"),
    }


def _config(media: dict[str, Path], **runtime: Any) -> PipelineConfig:
    return PipelineConfig(model=ModelConfig(path=str(media["model"])),
                          source=SourceConfig(uri=str(media["video"]), loop=runtime.pop("loop", False)),
                          runtime=RuntimeConfig(**runtime))


class Recorder(BaseObserver):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_start(self, info: dict[str, Any]) -> None:
        self.events.append(("start", dict(info)))

    def on_frame(self, stats: PipelineStats) -> None:
        self.events.append(("frame", stats.frames))

    def on_stop(self, summary: dict[str, Any]) -> None:
        self.events.append(("stop", summary))


def test_every_frame_goes_through_with_fixed_reused_buffers(media: dict[str, Path]) -> None:
    config = _config(media, queue_size=4, slots=2)
    with open_processor(config) as processor:
        assert processor.kind == "cpu" and len(processor.slots) == 2
        bound = [id(slot.session.inputs[processor.input_name]) for slot in processor.slots]
        outputs = [{k: id(v) for k, v in slot.session.outputs.items()} for slot in processor.slots]
        pipeline = Pipeline(config, processor=processor, handle_signals=False)
        summary = pipeline.run()
        # Each slot letterboxed into its own session's bound input and decoded from its bound outputs:
        # the buffers are the ones allocated at open, one set per slot.
        assert len(set(bound)) == 2
        assert [id(slot.input) for slot in processor.slots] == bound
        assert [{k: id(v) for k, v in slot.session.outputs.items()} for slot in processor.slots] == outputs
    assert summary["frames"] == 40 and summary["stopped_by"] == "end of input"
    assert summary["detections_per_class"] == {"class0": 40}  # the tiny model finds one box per frame
    # Each frame in flight adopted one pixel buffer (the source's first decode) and reused it afterwards.
    assert len(pipeline.frames) == 4 and pipeline.frame_buffer_allocations <= len(pipeline.frames)
    assert set(summary["latency_ms"]) == set(STAGES)
    assert summary["latency_ms"]["infer"]["p50"] > 0 and summary["fps"] > 0
    assert summary["processing"] == "cpu" and summary["slots"] == 2 and "gpu_ms" not in summary


def test_results_come_out_in_frame_order_from_several_slots(media: dict[str, Path], tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    summary = Pipeline(_config(media, slots=3), sinks=[f"jsonl://{events}"], handle_signals=False).run()
    frames = [json.loads(line)["frame"] for line in events.read_text().splitlines()]
    assert summary["slots"] == 3 and frames == list(range(40))


def test_observer_hooks_in_order(media: dict[str, Path]) -> None:
    recorder = Recorder()
    assert isinstance(recorder, PipelineObserver)
    Pipeline(_config(media, max_frames=7), observers=[recorder], handle_signals=False).run()
    kinds = [kind for kind, _ in recorder.events]
    assert kinds == ["start"] + ["frame"] * 7 + ["stop"]
    # on_start comes once the first frame is through; on_frame after each completed frame.
    assert [v for k, v in recorder.events if k == "frame"] == list(range(1, 8))
    info = recorder.events[0][1]
    assert info["backend"] == "onnxruntime" and info["input"]["shape"] == [1, 3, 32, 32]
    assert recorder.events[-1][1]["frames"] == 7 and recorder.events[-1][1]["stopped_by"] == "max_frames"


def test_a_failing_observer_is_dropped_not_fatal(media: dict[str, Path]) -> None:
    class Broken(BaseObserver):
        def on_frame(self, stats: PipelineStats) -> None:
            raise RuntimeError("observer bug")

    recorder = Recorder()
    summary = Pipeline(_config(media, max_frames=5), observers=[Broken(), recorder], handle_signals=False).run()
    assert summary["frames"] == 5 and len([k for k, _ in recorder.events if k == "frame"]) == 5


def test_admission_hook_paces_capture(media: dict[str, Path]) -> None:
    calls: list[float] = []

    def admit() -> None:  # a budget controller would block here to slow the pipeline
        calls.append(time.perf_counter())
        time.sleep(0.02)

    summary = Pipeline(_config(media, max_frames=10), admit=admit, handle_signals=False).run()
    assert summary["frames"] == 10 and len(calls) == 10
    assert calls[-1] - calls[0] >= 9 * 0.02


def test_request_stop_from_another_thread_finishes_in_flight_frames(media: dict[str, Path]) -> None:
    recorder = Recorder()
    pipeline = Pipeline(_config(media, loop=True), observers=[recorder], handle_signals=False)
    timer = threading.Timer(0.5, pipeline.request_stop)
    timer.start()
    started = time.monotonic()
    summary = pipeline.run()
    timer.join()
    assert time.monotonic() - started < 10
    assert summary["stopped_by"] == "stop requested" and summary["frames"] > 0
    assert recorder.events[-1][0] == "stop"


def test_a_stage_error_stops_the_pipeline_and_is_raised(media: dict[str, Path]) -> None:
    recorder = Recorder()
    pipeline = Pipeline(_config(media), source=VanishingCamera(5), observers=[recorder], handle_signals=False)
    with pytest.raises(SourceError, match="device removed"):
        pipeline.run()
    assert recorder.events[-1][0] == "stop" and "device removed" in recorder.events[-1][1]["error"]


class _SlowSink(Sink):
    needs_image = True

    def __init__(self) -> None:
        super().__init__("slow://")
        self.frames = 0

    def open(self, info: StreamInfo) -> None:
        self.info = info

    def write(self, result: FrameResult) -> None:
        time.sleep(0.05)
        self.frames += 1


def test_a_slow_sink_drops_frames_and_never_slows_the_pipeline(media: dict[str, Path], tmp_path: Path) -> None:
    slow = _SlowSink()
    events = tmp_path / "e.jsonl"
    summary = Pipeline(_config(media), sinks=[slow, f"jsonl://{events}"], handle_signals=False).run()
    assert summary["frames"] == 40
    assert summary["drops"]["sink:slow://"] == 40 - slow.frames > 0
    assert len(events.read_text().splitlines()) == 40  # the fast sink got everything
    assert slow.info.width == 96 and slow.info.stats is not None


def test_live_source_stale_frames_are_counted(media: dict[str, Path]) -> None:
    from edgert.io.sources import LiveSource

    cv2 = pytest.importorskip("cv2")
    camera = LiveSource("file-camera", lambda: cv2.VideoCapture(str(media["video"])), backoff=0.01)

    def admit() -> None:
        time.sleep(0.03)  # slower than the grabber: stale frames pile up and are dropped

    summary = Pipeline(_config(media, max_frames=15), source=camera, admit=admit, handle_signals=False).run()
    assert summary["frames"] == 15 and summary["drops"].get("stale_frames", 0) > 0


def test_latency_ring_quantiles() -> None:
    ring = LatencyRing(size=100)
    for ms in range(1, 201):  # only the last 100 (101..200 ms) remain
        ring.add(ms / 1000.0)
    q = ring.quantiles_ms()
    assert q["p50"] == pytest.approx(150.5) and q["p99"] == pytest.approx(199.01) and ring.count == 200


def test_source_routing_used_by_the_runner(media: dict[str, Path]) -> None:
    with open_source(str(media["video"])) as source:
        assert not source.live and source.width == 96
