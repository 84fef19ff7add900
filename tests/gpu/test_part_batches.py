"""Part batches on ONNX Runtime CUDA (``GpuSession.allow_part_batches`` / ``use_rows``): a model with a dynamic
batch runs a short batch at the smallest allowed size on the first rows of the same device buffers; a fixed
batch or a CUDA graph keeps one size and says why.

Skips with a reason where there is no GPU, no pycuda or no onnxruntime CUDA provider (CI).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.gpu.test_gpu_device import _REASON, ort_only
from tests.helpers import scale_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or ""), ort_only]


def test_a_short_batch_runs_on_the_first_rows_at_the_next_size(tmp_path: Path) -> None:
    from edgert.backends import SessionOptions, open_session
    from edgert.backends.cuda import copy_dtoh_async

    model = scale_model(tmp_path / "dyn.onnx", shape=("n", 8), factor=3.0)
    first = np.arange(64, dtype=np.float32).reshape(8, 8)
    with open_session(model, "onnxruntime-cuda", SessionOptions(shapes={"x": (8, 8)})) as session:
        assert session.allow_part_batches() == ((1, 2, 4, 8), "")
        np.testing.assert_allclose(session.infer({"x": first})["y"], first * 3.0)  # the whole batch: all 8 rows
        second = -first
        assert session.use_rows(3) == 4  # 3 rows run at size 4
        session.infer({"x": second})
        out = session.outputs["y"]
        np.testing.assert_allclose(out[:4], second[:4] * 3.0)  # the rows it ran
        np.testing.assert_allclose(out[4:], first[4:] * 3.0)  # untouched: the model ran at 4, not 8
        assert session.use_rows(1) == 1 and session.use_rows(8) == 8
        session.compute_only()
        with session.device.active():
            copy_dtoh_async(session.outputs["y"], session.device_outputs["y"].ptr, session.stream)
            session.stream.synchronize()
        np.testing.assert_allclose(session.outputs["y"], second * 3.0)  # back at 8: every row again


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_one_size_where_the_model_cannot_run_others(tmp_path: Path, cuda_graph: bool) -> None:
    from edgert.backends import SessionOptions, open_session

    shape = (8, 8) if not cuda_graph else ("n", 8)
    model = scale_model(tmp_path / "m.onnx", shape=shape, factor=2.0)
    options = SessionOptions(shapes={"x": (8, 8)}, cuda_graph=cuda_graph)
    with open_session(model, "onnxruntime-cuda", options) as session:
        sizes, why = session.allow_part_batches()
        assert sizes == (8,)
        assert why == ("a CUDA graph replays one batch size" if cuda_graph else
                       "the model's batch is fixed (x); edgert rebatch makes it dynamic")
        assert session.use_rows(3) == 8
