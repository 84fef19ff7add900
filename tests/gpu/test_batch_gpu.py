"""Detectors with their batch made dynamic, on ONNX Runtime CUDA: every row of a batch-4 run equals the
original batch-1 model on that row's input, both on the GPU (so only the batching differs).

Skips with a reason where there is no GPU, no pycuda or no onnxruntime CUDA provider (CI).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.gpu.test_gpu_device import _REASON

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


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
