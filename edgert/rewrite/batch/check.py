"""Checking a rewrite: both models on ONNX Runtime CPU, row by row, so a wrong rewrite is caught, not trusted."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from edgert.backends.onnxruntime import cpu_session
from edgert.onnx_dequantize import DequantizeError, dequantized
from edgert.onnx_file import QDQ_OPS, has_qdq
from edgert.rewrite.batch.model import ONNX_NP, BatchRewriteError, ModelLike, dims, load_model, real_inputs

__all__ = ["check_batch_rewrite"]


#: What a check compared (``compared`` in its records).
FLOAT, TWINS, REFERENCE_OPS = "float", "float twins (Q/DQ nodes unchanged)", "Q/DQ as reference operators"


def _qdq_nodes(model: onnx.ModelProto) -> list[tuple[str, ...]]:
    """Each Q/DQ node as its operator, wiring, attributes and the values of its scale and zero point."""
    nodes = [n for n in model.graph.node if n.op_type in QDQ_OPS]
    params = {name for n in nodes for name in n.input[1:]}  # scales and zero points only, not the weights
    values = {t.name: t.SerializeToString() for t in model.graph.initializer if t.name in params}
    values.update({n.output[0]: b"".join(a.SerializeToString() for a in n.attribute)
                   for n in model.graph.node if n.op_type == "Constant" and n.output and n.output[0] in params})
    return sorted((n.op_type, *n.input, "->", *n.output, *(a.SerializeToString().hex() for a in n.attribute),
                   *(values.get(i, b"").hex() for i in n.input[1:])) for n in nodes)


def _compared(orig: onnx.ModelProto, rew: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto, str]:
    """The pair of models the check runs, and what they are. A quantized model whose rewrite left every Q/DQ node
    as it was is checked on both float twins (:mod:`edgert.onnx_dequantize` says why). One without twins (a
    rewrite that touched a Q/DQ node, a QuantizeLinear read by another operator) is run with ONNX Runtime's graph
    optimizations off, so Q/DQ are their own operators, not fused int8 kernels that round differently at
    another batch size."""
    if not has_qdq(orig.graph):
        return orig, rew, FLOAT
    if _qdq_nodes(orig) == _qdq_nodes(rew):
        with contextlib.suppress(DequantizeError):  # no twin: run as they are, below
            return dequantized(orig), dequantized(rew), TWINS
    return orig, rew, REFERENCE_OPS


#: The tolerance of a model that computes in FP16 (ModelOpt's default output): another batch size's kernels
#: change the last bits of FP16 (relative step 1e-3) as they change those of FP32; a wrong rewrite moves rows.
FP16_RTOL = 2e-3


def _computes_in_fp16(model: onnx.ModelProto) -> bool:
    g = model.graph
    return any(t.data_type == onnx.TensorProto.FLOAT16 for t in g.initializer) or any(
        v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for v in (*g.input, *g.output))


def check_batch_rewrite(original: ModelLike, rewritten: ModelLike, batches: Sequence[int] = (1, 2, 4),
                        rtol: float = 1e-4, seed: int = 0, threads: int = 0,
                        label: str | None = None) -> list[dict[str, Any]]:
    """Run both on ONNX Runtime CPU: row i of the rewritten model at batch B must equal the original on input i.

    Inputs are B different random images-like tensors. The error of a row is ``max|got - want|`` over the
    largest ``|want|`` of that output, so values near zero do not make the check flaky; it must stay within
    ``rtol`` (:data:`FP16_RTOL` at least for a model that computes in FP16). A quantized model is compared on
    its float twins where it has them (``compared`` in each record says on what). Returns one record per batch
    size; raises :class:`BatchRewriteError` naming the first output, batch and row that differ.
    """
    orig, label = load_model(original, label)
    rew, _ = load_model(rewritten)
    if not batches or min(batches) < 1:
        raise BatchRewriteError(f"{label}: batch sizes to check must be 1 or more, got {list(batches)}")
    for vi in real_inputs(orig.graph):
        if any(not isinstance(d, int) for d in dims(vi)):
            raise BatchRewriteError(f"{label}: input {vi.name} of the original has dynamic dimensions "
                                    f"{dims(vi)}; the check feeds batch-1 inputs of fixed size")
    run_orig, run_rew, compared = _compared(orig, rew)
    optimize = compared != REFERENCE_OPS
    rtol = max(rtol, FP16_RTOL) if _computes_in_fp16(orig) else rtol
    s_orig, s_rew = (cpu_session(m, threads, spin_wait=True, optimize=optimize, what="checking a batch rewrite")
                     for m in (run_orig, run_rew))
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
        results.append({"batch": b, "max_rel_err": worst, "compared": compared})
    return results
