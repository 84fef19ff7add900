"""The GPU NMS (edgert/vision/kernels/nms.cu) against the host's finishing step on the same model outputs.

Two processors on one batched model, one with the NMS on the GPU (the default) and one with it on the host
(``gpu_nms=False``: the filter's rows come back and ``DecoderBase._finish_batch`` with OpenCV's NMS runs on
them), fed the same frames of three sizes in one batch: every frame's detections are the same boxes (the same
float32 operations, so equal to rounding), scores and classes, in the same best-first order. The model's output
differs between the two processors only by cuDNN's run-to-run noise, so the comparison is on outputs made by
one slot: the host path's finishing is applied to the GPU processor's own output tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.gpu.test_gpu_device import _REASON, NANODET, YOLOV8

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

_BATCH = 6  # six vtest frames, bus.jpg (portrait, larger), a small image (upscaled)


@pytest.fixture(scope="module")
def batched(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """name -> the detector rewritten to a dynamic batch and ready for ``_BATCH`` frames a call, made once per
    module (on TensorRT each is an engine build)."""
    from edgert.rewrite.batch import batched_model_path
    from tests.gpu.test_gpu_device import _model, prepared

    root, made = tmp_path_factory.mktemp("batched"), {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = prepared(batched_model_path(_model(assets, name), root), _BATCH)
        return made[name]

    return get

_CASES = [
    (NANODET, {}),
    (NANODET, {"conf": 0.05}),  # hundreds of candidates per frame: the NMS does real work
    (NANODET, {"conf": 0.1, "classes": (0, 2), "iou": 0.3}),
    (NANODET, {"conf": 0.05, "agnostic": True, "max_det": 5}),
    (YOLOV8, {}),
    (YOLOV8, {"conf": 0.05, "classes": (1,)}),
]


@pytest.mark.parametrize(("name", "decode"), _CASES)
def test_gpu_nms_equals_host_finishing(assets: Path, batched: Any, name: str, decode: dict[str, Any]) -> None:
    from edgert.backends.cuda import copy_dtoh_async
    from edgert.config import DecodeConfig, ModelConfig, PipelineConfig, RuntimeConfig
    from edgert.pipeline.gpu import GpuProcessor, GpuSlot
    from edgert.stats import STAGES
    from edgert.vision.gpu_decode import candidates_to_detections_batch, emulate_filter
    from tests.gpu.test_gpu_device import GPU_BACKEND, _frames

    frames = _frames(assets, _BATCH)
    b = len(frames)
    config = PipelineConfig(model=ModelConfig(path=str(batched(name))),
                            decode=DecodeConfig(**decode), runtime=RuntimeConfig(slots=1))
    with GpuProcessor(config, GPU_BACKEND, batch=b) as proc:
        assert proc.gpu_nms and proc.describe()["decode"] == "gpu-filter+gpu-nms"
        slot = proc.slots[0]
        assert isinstance(slot, GpuSlot) and slot.nms is not None and slot.filter is not None
        with slot.device.active():
            got = slot.process(frames, [np.zeros(len(STAGES)) for _ in frames])
            output = slot.session.outputs[proc.output_name]
            copy_dtoh_async(output, slot.output_ptr, slot.stream)
            slot.stream.synchronize()
        transforms = [proc.letterbox.transform_for(*f.shape[:2]) for f in frames]
        rows = [emulate_filter(output[k:k + 1], slot.decoder.kind, float(slot.filter.conf)) for k in range(b)]
        want = candidates_to_detections_batch(rows, slot.decoder, transforms)
        # and the host decoder alone on each sample's output (the CPU processor's step)
        alone = [slot.decoder({proc.output_name: output[k:k + 1]}, transforms[k]) for k in range(b)]
    assert len(got) == b
    total = 0
    for k in range(b):
        g, w, a = got[k], want[k], alone[k]
        assert np.array_equal(g.class_id, w.class_id), k
        assert np.array_equal(g.confidence, w.confidence), k
        assert g.xyxy.dtype == np.float32 and g.confidence.dtype == np.float32 and g.class_id.dtype == np.int32
        worst = float(np.abs(g.xyxy - w.xyxy).max()) if len(g) else 0.0
        assert worst <= 1e-3, (k, worst)
        assert np.array_equal(g.class_id, a.class_id) and np.allclose(g.xyxy, a.xyxy, atol=1e-3), k
        if decode.get("classes"):
            assert set(g.class_id.tolist()) <= set(decode["classes"])
        assert len(g) <= int(decode.get("max_det", 300))
        total += len(g)
    print(f"{name} {decode}: {b} frames, {total} detections, GPU NMS == host finishing "
          f"({sum(len(r) for r in rows)} candidates)")
    assert total > 0


@pytest.mark.parametrize("name", [NANODET, YOLOV8])
def test_a_part_batch_gives_each_frame_its_own_detections(assets: Path, batched: Any, name: str) -> None:
    """A batch shorter than the processor's (the batcher sends one when the engine is idle, or at a source's end)
    gives every frame the detections it gets in a full batch: its boxes, scores and classes. Before session 11
    the host read a part batch's scores and classes at a full batch's offsets: right boxes, every score 0.0 and
    every class 0. Where the model's batch is dynamic the part batch also runs the engine at its own size
    (``GpuSession.batch_sizes``), so scores may differ by cuDNN's noise between the two sizes."""
    from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig
    from edgert.pipeline.gpu import GpuProcessor, GpuSlot
    from edgert.stats import STAGES
    from tests.gpu.test_gpu_device import GPU_BACKEND, _frames

    frames = _frames(assets, _BATCH)  # the processor's batch
    model = batched(name)
    config = PipelineConfig(model=ModelConfig(path=str(model)), runtime=RuntimeConfig(slots=1))
    with GpuProcessor(config, GPU_BACKEND, batch=len(frames)) as proc:
        slot = proc.slots[0]
        assert isinstance(slot, GpuSlot) and slot.nms is not None
        with slot.device.active():
            full = slot.process(frames, [np.zeros(len(STAGES)) for _ in frames])
            parts = [slot.process(frames[a:b], [np.zeros(len(STAGES)) for _ in frames[a:b]])
                     for a, b in ((0, 3), (3, 4), (4, 8))]
    got = [d for part in parts for d in part]
    assert len(got) == len(full) and sum(len(d) for d in full) > 0
    for k, (g, w) in enumerate(zip(got, full)):
        assert np.array_equal(g.class_id, w.class_id), k
        assert np.allclose(g.confidence, w.confidence, atol=2e-3), (k, g.confidence, w.confidence)
        assert np.allclose(g.xyxy, w.xyxy, atol=0.5), k
    print(f"{name}: part batches 3 + 1 + 4 of 8 == the full batch, {sum(len(d) for d in full)} detections")
