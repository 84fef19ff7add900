"""The batcher's straggler rule: while a batch is in flight the next one gathers (up to ``batch_timeout_ms``);
a free slot alone does not launch a part batch. On a fixed-shape engine a part batch costs a whole batch's
compute, which is what put 16 streams below their compute-only rate on the H100 (docs/pipeline.md, issue 28
session 10). The engine here is the real CPU processor with a fixed cost added to each call (:func:`slowed`),
as a GPU's batch-16 run has one: the decisions under test are the batcher's, not the model's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.pipeline import Pipeline
from edgert.pipeline.choice import open_processor
from edgert.pipeline.processor import ProcessorSlot
from edgert.vision.detections import Detections
from tests.pipeline.media import make_video, tiny_detector

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

CALL_S = 0.08  # each engine call, longer than the 50 ms between two out-of-step cameras' frames


def slowed(slot: ProcessorSlot) -> ProcessorSlot:
    """``slot`` (a real CPU slot) with ``CALL_S`` more on each engine call: sleeping, so CPU load does not move it."""
    call = slot.process

    def process(frames: Sequence[np.ndarray], timings: Sequence[np.ndarray]) -> list[Detections]:
        time.sleep(CALL_S)
        return call(frames, timings)

    slot.process = process  # type: ignore[method-assign]
    return slot


def test_a_part_batch_waits_while_another_is_in_flight(tmp_path: Path) -> None:
    # Two cameras at 10 fps, half an interval apart: a frame every 50 ms, calls of 80 ms on two slots. Launched
    # whenever a slot is free, every call would carry one frame (batch_fill 0.5); gathered while a call is in
    # flight, most carry two (27 calls for 40 frames here, against 40 with the slot rule).
    video, model = make_video(tmp_path / "v.avi", frames=20, fps=10.0), tiny_detector(tmp_path / "t.onnx")
    cameras = tuple(SourceConfig(uri=str(video), realtime=True, realtime_phase=p, capture="thread") for p in (0, 0.5))
    config = PipelineConfig(model=ModelConfig(path=str(model), backend="onnxruntime"), sources=cameras,
                            runtime=RuntimeConfig(batch=2, slots=2, batch_timeout_ms=1000, warmup=0))
    with open_processor(config, batch=2, sources=2) as processor:
        assert processor.batch == 2 and len(processor.slots) == 2
        processor.slots = [slowed(s) for s in processor.slots]
        summary = Pipeline(config, processor=processor, handle_signals=False).run()
    assert summary["frames"] == 40, summary
    assert summary["batch_fill"] >= 0.65, (summary["batches"], summary["batch_fill"])
