"""Checking a rewrite: both models on ONNX Runtime CPU, row by row, so a wrong rewrite is caught, not trusted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from edgert.backends.onnxruntime import cpu_session
from edgert.onnx_file import has_qdq
from edgert.rewrite.batch.model import ONNX_NP, BatchRewriteError, ModelLike, dims, load_model, real_inputs

__all__ = ["check_batch_rewrite"]


# A quantized model is checked with ONNX Runtime's graph optimizations off, so Q/DQ run as their own operators and
# not as fused int8 kernels: with those, a YOLOv8s Q/DQ row differed by 0.75 % between batch 1 and 2 on the device
# machine's Intel Xeon (by nothing on an AMD EPYC), and the check refused a correct rewrite.
def _session(model: onnx.ModelProto, threads: int) -> Any:
    return cpu_session(model, threads, spin_wait=True, optimize=not has_qdq(model.graph),
                       what="checking a batch rewrite")


def check_batch_rewrite(original: ModelLike, rewritten: ModelLike, batches: Sequence[int] = (1, 2, 4),
                        rtol: float = 1e-4, seed: int = 0, threads: int = 0,
                        label: str | None = None) -> list[dict[str, Any]]:
    """Run both on ONNX Runtime CPU: row i of the rewritten model at batch B must equal the original on input i.

    Inputs are B different random images-like tensors. The error of a row is ``max|got - want|`` over the
    largest ``|want|`` of that output, so values near zero do not make the check flaky; it must stay within
    ``rtol``. Returns one record per batch size; raises :class:`BatchRewriteError` naming the first
    output, batch and row that differ.
    """
    orig, label = load_model(original, label)
    rew, _ = load_model(rewritten)
    if not batches or min(batches) < 1:
        raise BatchRewriteError(f"{label}: batch sizes to check must be 1 or more, got {list(batches)}")
    for vi in real_inputs(orig.graph):
        if any(not isinstance(d, int) for d in dims(vi)):
            raise BatchRewriteError(f"{label}: input {vi.name} of the original has dynamic dimensions "
                                    f"{dims(vi)}; the check feeds batch-1 inputs of fixed size")
    s_orig, s_rew = _session(orig, threads), _session(rew, threads)
    rng = np.random.default_rng(seed)
    n = max(batches)
    rows: list[dict[str, np.ndarray]] = []
    for _ in range(n):
        row: dict[str, np.ndarray] = {}
        for a in s_orig.get_inputs():
            shape = [int(d) for d in a.shape]
            if a.type == "tensor(float)":
                row[a.name] = rng.random(shape, dtype=np.float32)
            elif a.type == "tensor(float16)":
                row[a.name] = rng.random(shape, dtype=np.float32).astype(np.float16)
            else:
                row[a.name] = np.zeros(shape, dtype=ONNX_NP.get(onnx.TensorProto.INT64, np.int64))
        rows.append(row)
    names = [o.name for o in s_orig.get_outputs()]
    want = [s_orig.run(names, r) for r in rows]
    results: list[dict[str, Any]] = []
    for b in batches:
        feed = {k: np.concatenate([r[k] for r in rows[:b]], axis=0) for k in rows[0]}
        got = s_rew.run(names, feed)
        worst = 0.0
        for oi, name in enumerate(names):
            g = np.asarray(got[oi])
            if g.shape[0] != b:
                raise BatchRewriteError(f"{label}: the rewritten model's output {name} has {g.shape[0]} rows at "
                                        f"batch {b}")
            for r in range(b):
                w = np.asarray(want[r][oi])
                gr = g[r:r + 1]
                if gr.shape != w.shape:
                    raise BatchRewriteError(f"{label}: output {name} row {r} at batch {b} has shape "
                                            f"{list(gr.shape)}, the original gives {list(w.shape)}")
                if w.size == 0:
                    continue
                scale = float(np.max(np.abs(w.astype(np.float64))))
                err = float(np.max(np.abs(gr.astype(np.float64) - w.astype(np.float64))))
                rel = err / scale if scale > 0 else err
                if not np.isfinite(rel) or rel > rtol:
                    raise BatchRewriteError(f"{label}: the batch rewrite changes output {name} at batch {b} row "
                                            f"{r} (relative error {rel:.2g} > {rtol:g}); not batching this model")
                worst = max(worst, rel)
        results.append({"batch": b, "max_rel_err": worst})
    return results
