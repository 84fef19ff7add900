"""Detectors with their batch made dynamic, on ONNX Runtime CUDA: every row of a batch-4 run equals the
original batch-1 model on that row's input, both on the GPU (so only the batching differs).

Skips with a reason where there is no GPU, no pycuda or no onnxruntime CUDA provider (CI).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.gpu.test_gpu_device import _REASON, ort_only

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or ""), ort_only]


@pytest.mark.parametrize("name", ["yolov8s-fall-640.onnx", "nanodet-m-416-coco-v8layout.onnx",
                                  "yolov3-tiny-coco-416.onnx"])
def test_batched_rows_equal_batch1_on_cuda(assets: Path, tmp_path: Path, name: str) -> None:
    from edgert.backends import SessionOptions, open_session
    from edgert.rewrite.batch import batched_model_path

    src = assets / "models" / "detection" / name
    if not src.exists():
        pytest.skip(f"{src} not in the assets")
    dyn = batched_model_path(src, tmp_path)
    b = 4
    with open_session(src, "onnxruntime-cuda") as one:
        shape = one.inputs["images"].shape
        x = np.random.default_rng(3).random((b, *shape[1:]), dtype=np.float32)
        want = [{k: v.copy() for k, v in one.infer({"images": x[r:r + 1]}).items()} for r in range(b)]
    with open_session(dyn, "onnxruntime-cuda", SessionOptions(shapes={"images": (b, *shape[1:])})) as many:
        got = many.infer({"images": x})
        worst = 0.0
        for r in range(b):
            for k, w in want[r].items():
                assert got[k].shape[0] == b and got[k][r:r + 1].shape == w.shape
                worst = max(worst, float(np.abs(got[k][r:r + 1] - w).max()) / float(np.abs(w).max()))
    print(f"{name}: batch {b} rows vs batch 1 on CUDA, max relative error {worst:.2e}")
    assert worst <= 1e-3


@pytest.mark.parametrize("name", ["nanodet-m-416-coco-v8layout.onnx", "yolov8s-fall-640.onnx"])
def test_one_launch_per_batch_equals_each_frame_alone(assets: Path, tmp_path: Path, name: str) -> None:
    """Frames of three sizes in one batch: the batched letterbox launch writes each sample exactly as the
    reference does for that frame alone, and the batched filter gives each sample the rows the reference
    filter gives on that sample's own output (the decoding of each then equals the host decoder's)."""
    from edgert.backends.cuda import copy_dtoh_async
    from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig
    from edgert.pipeline.gpu import GpuProcessor, GpuSlot
    from edgert.rewrite.batch import batched_model_path
    from edgert.stats import STAGES
    from edgert.vision.gpu_decode import emulate_filter
    from edgert.vision.gpu_preprocess import emulate_letterbox
    from tests.gpu.test_gpu_device import _frames, _model

    src = _model(assets, name)
    frames = _frames(assets, 2)  # two vtest frames, bus.jpg (portrait, larger), a small image (upscaled)
    b = len(frames)
    config = PipelineConfig(model=ModelConfig(path=str(batched_model_path(src, tmp_path))),
                            runtime=RuntimeConfig(slots=1))
    # gpu_nms=False: the filter's rows come back to the host, where this test reads them (tests/gpu/test_gpu_nms.py
    # checks the GPU NMS against this host path)
    with GpuProcessor(config, "onnxruntime-cuda", batch=b, gpu_nms=False) as proc:
        slot = proc.slots[0]
        assert isinstance(slot, GpuSlot) and slot.filter is not None and slot.nms is None
        with slot.device.active():
            dets = slot.process(frames, [np.zeros(len(STAGES)) for _ in frames])
            tensor = slot.session.inputs[proc.input_name]
            copy_dtoh_async(tensor, slot.input_ptr, slot.stream)
            output = slot.session.outputs[proc.output_name]
            copy_dtoh_async(output, slot.output_ptr, slot.stream)
            slot.stream.synchronize()
        for k, frame in enumerate(frames):
            assert float(np.abs(tensor[k] - emulate_letterbox(frame, proc.plan)).max()) == 0.0
            want = emulate_filter(output[k:k + 1], slot.decoder.kind, float(slot.filter.conf))
            got = slot.filter.rows(k)
            assert got is not None
            got = got[np.argsort(got[:, 6], kind="stable")]
            assert np.array_equal(got, want)
            transform = proc.letterbox.transform_for(*frame.shape[:2])
            host = slot.decoder({proc.output_name: output[k:k + 1]}, transform)
            assert np.array_equal(dets[k].class_id, host.class_id)
            assert np.allclose(dets[k].xyxy, host.xyxy, atol=1e-3)
        from edgert.backends import cuda

        if int(cuda.pycuda_driver().get_driver_version()) >= 13000:  # the frames went up in one batched copy
            assert cuda._batch_copy not in (None, False)
        print(f"{name}: batch of {b} frames of 3 sizes, tensors exact, filter rows exact, "
              f"{sum(len(d) for d in dets)} detections")


@pytest.mark.parametrize("name", ["nanodet-m-416-coco-v8layout.onnx", "yolov8s-fall-640.onnx"])
def test_gpu_slots_default_by_batch(assets: Path, tmp_path: Path, name: str) -> None:
    """Three batches in flight for a few sources; from a batch of MANY_SOURCES_BATCH a fourth on trial, kept
    after the warm-up only where the model's batch is short (keep_trial_slot); runtime.slots always wins."""
    from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig
    from edgert.pipeline.gpu import GpuProcessor
    from edgert.pipeline.processor import MANY_SOURCES_BATCH, TRIAL_SLOT_MAX_MS
    from edgert.rewrite.batch import batched_model_path
    from tests.gpu.test_gpu_device import _model

    path = str(batched_model_path(_model(assets, name), tmp_path))
    seen = {}
    for batch, slots, runs in ((1, None, 2), (MANY_SOURCES_BATCH - 1, None, 2), (16, None, 2), (16, None, 0),
                               (16, 2, 2)):
        config = PipelineConfig(model=ModelConfig(path=path), runtime=RuntimeConfig(slots=slots))
        with GpuProcessor(config, "onnxruntime-cuda", batch=batch) as proc:
            before = len(proc.slots)
            proc.warm_up(runs)
            ms = proc.warmup_model_ms
            seen[(batch, slots, runs)] = (before, len(proc.slots), proc.describe()["slots"])
            if (batch, runs) == (16, 2) and slots is None:
                print(f"{name}: batch 16 model {ms:.2f} ms -> {len(proc.slots)} slots ({proc.slots_rule})")
                assert ms is not None and len(proc.slots) == (4 if ms < TRIAL_SLOT_MAX_MS else 3)
                assert f"{ms:.1f} ms" in proc.slots_rule
    kept = seen[(16, None, 2)][1]
    assert seen == {(1, None, 2): (3, 3, 3), (MANY_SOURCES_BATCH - 1, None, 2): (3, 3, 3),
                    (16, None, 2): (4, kept, kept), (16, None, 0): (4, 3, 3), (16, 2, 2): (2, 2, 2)}
