"""AdaRound: each Conv's weight rounding learned by gradient descent on a soft rounding (Nagel et al. 2020).

"Up or Down? Adaptive Rounding for Post-Training Quantization" (ICML 2020): the INT8 value of a weight is
``floor(w / s) + h(V)`` with ``h(V) = clip(sigmoid(V) (zeta - gamma) + gamma, 0, 1)`` (the rectified sigmoid,
``zeta = 1.1``, ``gamma = -0.1``); ``V`` is learned to minimise the layer's output error plus a regulariser
``lambda * sum(1 - |2 h - 1|^beta)`` whose ``beta`` is annealed from 20 to 2 after a warm-up without it, so
every ``h`` ends at 0 or 1 (round down or up). The output error is :mod:`.rounding`'s
``tr(dW H dW^T)``, ``H = E[x x^T]`` of the layer's input patches with the input quantized as in the model,
gradient ``2 dW H``: numpy only, no autograd.

* Layers run in graph order, and each layer's ``H`` comes from the Q/DQ model with the roundings already
  chosen for the layers before it, so a later layer fits the inputs the quantized model really gives it
  (``stages``: the layers are grouped into that many runs of the Q/DQ model; one run per layer by default).
* ``H`` is replaced in the descent by its top ``rank`` eigen-directions plus the mean of the others on the
  rest (the descent costs ``2 C_out K rank`` per step, not ``C_out K^2``); the chosen rounding is judged on
  the full ``H``, and a layer keeps its nearest rounding when AdaRound's is not lower in output error.
* The scale per output channel is the nearest-rounding one: the Q/DQ layout and TensorRT's kernels are
  unchanged (as :mod:`.rounding`).

Measured, not kept (calibration/README.md): it fits its objective less far than the GPTQ step,
loses held out on NanoDet (-0.031 on draws 0-1) and costs 300-600 s per model on a 2-core CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgert.backends.onnxruntime import cpu_session
from edgert.calib.histograms import QUANT_LEVELS
from edgert.calib.qdq import GraphPlan, quantize_weight, write_qdq
from edgert.calib.rounding import ConvPatches, conv_layers, pick_rounding
from edgert.errors import CalibrationError, reraise_as

__all__ = ["adaround", "adaround_roundings"]

log = logging.getLogger(__name__)

ZETA, GAMMA = 1.1, -0.1


def _h(v: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.clip((1.0 / (1.0 + np.exp(-v))) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)
    return out


def _top_eigen(h: np.ndarray, rank: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """``H``'s top ``rank`` eigenvectors and values and the mean of the other eigenvalues; a randomised
    subspace iteration (Halko et al. 2011) past 2 x ``rank`` inputs, where a full ``eigh`` costs seconds."""
    hh = h.astype(np.float64)
    k = hh.shape[0]
    if k <= 2 * rank:
        evals, evecs = np.linalg.eigh(hh)
        r = min(rank, k)
        rest = float(max(np.mean(evals[:-r]), 0.0)) if r < k else 0.0
        return evecs[:, -r:].astype(np.float32), np.maximum(evals[-r:], 0.0), rest
    q = np.random.default_rng(seed).standard_normal((k, rank + 16))
    for _ in range(3):
        q, _ = np.linalg.qr(hh @ q)
    evals, small = np.linalg.eigh(q.T @ hh @ q)
    evals, vecs = evals[-rank:], (q @ small)[:, -rank:]
    rest = float(max((np.trace(hh) - np.sum(evals)) / (k - rank), 0.0))
    return vecs.astype(np.float32), np.maximum(evals, 0.0), rest


def adaround(w: np.ndarray, h: np.ndarray, iters: int = 300, reg: float = 1.0, lr: float = 0.01,
             warmup: float = 0.2, beta: tuple[float, float] = (20.0, 2.0), rank: int = 256) -> np.ndarray:
    """INT8 values of ``w`` (``[C_out, ...]``, per-output-channel nearest-rounding scales) rounded by AdaRound
    on ``H`` (see the module doc); ``reg`` is lambda per weight against the output error relative to nearest
    rounding's, Adam at ``lr`` on ``V``."""
    nearest, scale = quantize_weight(w, 0)
    rows = w.shape[0]
    wf = w.reshape(rows, -1).astype(np.float64)
    s = scale.astype(np.float64).reshape(-1, 1)
    base = np.floor(wf / s)
    rest = np.clip(wf / s - base, 0.0, 1.0)
    # h(V) = rest at the start: the soft rounding begins where the float weight is; a weight at +127 steps
    # (its row's largest) cannot round up
    p = np.clip((rest - GAMMA) / (ZETA - GAMMA), 1e-4, 1 - 1e-4)
    v = np.log(p / (1 - p)).astype(np.float32)
    top = base >= QUANT_LEVELS
    v[top] = -20.0
    u, lam, sigma = _top_eigen(h, rank)
    lam = (lam - sigma).astype(np.float32)  # H ~ U (lam) U^T + sigma I

    def rec(dw: np.ndarray) -> float:
        du = dw @ u
        return float(np.sum(du * du * lam) + sigma * np.sum(dw * dw))

    base32, s32, wf32 = base.astype(np.float32), s.astype(np.float32), wf.astype(np.float32)
    e0 = max(rec(nearest.reshape(rows, -1).astype(np.float32) * s32 - wf32), 1e-30)
    gscale = (2.0 / e0) * s32 * (ZETA - GAMMA)  # d(relative error)/dh, times dh/dsigmoid
    m1 = np.zeros_like(v)
    m2 = np.zeros_like(v)
    b1, b2, start = 0.9, 0.999, int(warmup * iters)
    for it in range(iters):
        sig = 1.0 / (1.0 + np.exp(-v))
        soft = sig * np.float32(ZETA - GAMMA) + np.float32(GAMMA)
        hv = np.clip(soft, 0.0, 1.0)
        dw = (base32 + hv) * s32 - wf32
        g = ((dw @ u) * lam) @ u.T + sigma * dw  # (H dW^T)^T, low rank + the rest's mean
        g *= gscale
        if it >= start:
            b = beta[0] + (beta[1] - beta[0]) * (it - start) / max(iters - start - 1, 1)
            x = 2.0 * hv - 1.0
            g -= np.float32(2.0 * reg * b * (ZETA - GAMMA)) * np.sign(x) * np.abs(x) ** np.float32(b - 1.0)
        g *= sig * (1.0 - sig) * ((soft > 0.0) & (soft < 1.0))
        m1 = b1 * m1 + (1 - b1) * g
        m2 = b2 * m2 + (1 - b2) * g * g
        v -= np.float32(lr / (1 - b1 ** (it + 1))) * m1 / (np.sqrt(m2 / np.float32(1 - b2 ** (it + 1))) + 1e-12)
    q: np.ndarray = np.clip(base + (_h(v) >= 0.5), -QUANT_LEVELS, QUANT_LEVELS)
    return q.reshape(w.shape).astype(np.int8)


def _conv_layers(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
                 per_image: int) -> tuple[dict[str, ConvPatches], dict[str, str]]:
    """Every quantized group-1 2-D Conv of ``plan`` in graph order (layers sequential: each sees the ones
    before it rounded), with a patch collector on its input."""
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    return conv_layers(model, sorted(plan.targets, key=lambda t: order.get(t.node, 0)), amax, per_image)


def adaround_roundings(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
                       feeds: Callable[[], Iterable[Mapping[str, np.ndarray]]], iters: int = 300,
                       stages: int | None = None, per_image: int = 256, threads: int = 0,
                       ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, float]]]:
    """``({weight initializer: INT8 values}, {node: {"nearest": e, "chosen": e}})`` as
    :func:`.rounding.weight_roundings` gives, by AdaRound, layers in graph order (``stages`` runs of the
    Q/DQ model over ``feeds()``; None: one per layer)."""
    layers, inputs = _conv_layers(model, plan, amax, per_image)
    if not layers:
        return {}, {}
    inits = {i.name: i for i in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input if i.name not in inits}
    weight_of = {t.node: t.weight for t in plan.targets}
    names = list(layers)
    count = len(names) if stages is None else max(1, min(stages, len(names)))
    groups = [list(g) for g in np.array_split(np.array(names, dtype=object), count) if len(g)]
    out: dict[str, np.ndarray] = {}
    errors: dict[str, dict[str, float]] = {}
    for group in groups:
        qdq = write_qdq(model, plan, amax, rounding=out)  # the roundings chosen so far; later layers nearest
        wanted = sorted({inputs[n] for n in group})
        fetch = [t for t in wanted if t not in graph_inputs]
        del qdq.graph.output[:]
        for t in fetch:
            qdq.graph.output.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
        with reraise_as(CalibrationError, "ONNX Runtime cannot load the Q/DQ model for AdaRound"):
            sess = cpu_session(qdq, threads, spin_wait=True, what="AdaRound") if fetch else None
        for feed in feeds():
            values = dict(zip(fetch, sess.run(fetch, dict(feed)))) if sess is not None else {}
            values.update({t: np.asarray(feed[t]) for t in wanted if t in graph_inputs})
            for node in group:
                layers[node].update(np.asarray(values[inputs[node]]))
            del values
        del sess, qdq
        for node in group:
            layer, name = layers[node], weight_of[node]
            if layer.count == 0 or name is None:
                continue
            w = numpy_helper.to_array(inits[name]).astype(np.float32)
            picked, errors[node] = pick_rounding(w, layer.hessian(), lambda w_, h_: adaround(w_, h_, iters=iters))
            if picked is not None:
                out[name] = picked
            layer.h = np.zeros((1, 1))  # H is done with: memory stays one group's
    if errors:
        gain = [e["nearest"] / max(e["chosen"], 1e-30) for e in errors.values()]
        log.info("AdaRound: %d of %d convs rounded (median output error / %.2f)", len(out), len(errors),
                 float(np.median(gain)))
    return out, errors
