"""The swap itself, batch by batch, on two real tiny detectors (CPU processor): batches stamped before the swap
run on the old model even when a slot takes them after it, the swap waits for them and closes the old model, the
first frame on the new one carries the swap event, and a batch that fails on a swapped-in model is re-run on the
model the failure hands back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgert.config import DecodeConfig, ModelConfig, PipelineConfig, RuntimeConfig
from edgert.pipeline.choice import open_processor
from edgert.pipeline.feeds import _Frame
from edgert.pipeline.model_update import UpdatableProcessor
from edgert.pipeline.processor import Processor
from tests.pipeline.media import tiny_detector

pytest.importorskip("onnxruntime")


def _processor(path: Path, scores: tuple[float, float], names: tuple[str, str] | None = None) -> Processor:
    tiny_detector(path, scores=scores)
    config = PipelineConfig(model=ModelConfig(path=str(path), backend="onnxruntime"),
                            decode=DecodeConfig(names=names), runtime=RuntimeConfig(slots=1, processing="cpu"))
    return open_processor(config)


def _frames(n: int) -> list[_Frame]:
    return [_Frame(pixels=np.zeros((32, 32, 3), np.uint8), index=i) for i in range(n)]


def _wait(cond: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def test_batches_stamped_before_the_swap_finish_on_the_old_model(tmp_path: Path) -> None:
    old = _processor(tmp_path / "a.onnx", (0.9, 0.1))  # finds class 0
    new = _processor(tmp_path / "b.onnx", (0.1, 0.9))  # finds class 1
    swap = UpdatableProcessor(old, label="a.onnx")
    frames = _frames(3)
    swap.batch_ready(frames[:1])  # in flight: stamped, not yet taken by a slot
    swapping = threading.Thread(target=swap.swap_in, args=(new, "b.onnx"))
    swapping.start()
    _wait(lambda: swap.generation == 1)
    swap.batch_ready(frames[1:2])
    assert swapping.is_alive()  # it waits for the batch in flight
    first = swap.slots[0].process_frames(frames[:1])  # taken after the swap, stamped before: the old model
    swapping.join(10)
    assert not swapping.is_alive() and not old.slots  # the old model closed once its batch was through
    second = swap.slots[0].process_frames(frames[1:2])
    assert first[0].class_id.tolist() == [0] and second[0].class_id.tolist() == [1]
    assert frames[0].notes is None
    assert frames[1].notes == [{"type": "model_swap", "frame": 1, "model": "b.onnx", "generation": 1}]
    swap.batch_ready(frames[2:3])
    assert frames[2].notes is None  # once per source
    assert swap.batches_on(1) == 1 and swap.batches_on(0) == 0  # generation 0 is gone with its processor
    swap.close()
    assert not new.slots


def test_a_failed_batch_on_the_new_model_runs_on_what_the_failure_hands_back(tmp_path: Path) -> None:
    old = _processor(tmp_path / "a.onnx", (0.9, 0.1))
    broken = _processor(tmp_path / "b.onnx", (0.1, 0.9))
    swap = UpdatableProcessor(old, label="a.onnx")
    swap.swap_in(broken, "b.onnx")
    broken.slots[0].session.close()  # type: ignore[attr-defined]  # its next batch fails
    failures: list[BaseException] = []

    def reopen(exc: BaseException) -> Processor:
        failures.append(exc)
        return _processor(tmp_path / "a2.onnx", (0.9, 0.1))

    swap.on_failure = reopen
    frames = _frames(2)
    swap.batch_ready(frames[:1])
    found = swap.slots[0].process_frames(frames[:1])
    assert found[0].class_id.tolist() == [0] and len(failures) == 1  # re-run on the model handed back
    assert swap.generation == 2 and swap.failure(1) is failures[0]
    swap.batch_ready(frames[1:])
    assert swap.slots[0].process_frames(frames[1:])[0].class_id.tolist() == [0]
    swap.on_failure = None
    swap.close()


def test_a_new_class_list_is_counted_by_name(tmp_path: Path) -> None:
    """The old model knows person and car, the new one car and bike: its car keeps id 1, bike becomes id 2."""
    old = _processor(tmp_path / "a.onnx", (0.1, 0.9), ("person", "car"))
    new = _processor(tmp_path / "b.onnx", (0.9, 0.1), ("car", "bike"))  # finds its class 0: car
    bikes = _processor(tmp_path / "c.onnx", (0.1, 0.9), ("car", "bike"))  # finds its class 1: bike
    swap = UpdatableProcessor(old)
    frames = _frames(3)
    swap.batch_ready(frames[:1])
    assert swap.slots[0].process_frames(frames[:1])[0].class_names() == ["car"]
    swap.swap_in(new, "b.onnx")
    assert swap.names == ("person", "car", "bike")
    swap.batch_ready(frames[1:2])
    found = swap.slots[0].process_frames(frames[1:2])[0]
    assert found.class_id.tolist() == [1] and found.class_names() == ["car"]  # the same id as before the swap
    swap.swap_in(bikes, "c.onnx")
    swap.batch_ready(frames[2:])
    found = swap.slots[0].process_frames(frames[2:])[0]
    assert found.class_id.tolist() == [2] and found.names == ("person", "car", "bike")
    swap.close()
