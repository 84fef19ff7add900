"""Weight rounding chosen by the layer's output error, not to the nearest INT8 step.

Rounding every weight to its nearest step minimises the weight error, not the layer's output error: for a
Conv with input patches ``x`` the output error is ``(W_q - W) x``, whose mean square over the calibration
activations is ``tr(dW H dW^T)`` with ``H = E[x x^T]``. AdaRound (Nagel et al., "Up or Down? Adaptive
Rounding", 2020) minimises that by gradient descent on a soft rounding; here the same objective is met
the way GPTQ does it (Frantar et al., 2022, the Optimal Brain Quantization step): the weights of one
input column are rounded, and the error that leaves is spread over the columns not yet rounded through
``H``'s inverse, so later roundings compensate. One pass per layer, ``O(K^3)`` for ``K`` inputs per output,
numpy only; seconds per layer where AdaRound's descent takes minutes on a CPU.

* ``H`` comes from a few hundred output positions per image sampled from the layer's *quantized* input
  (the FP32 activation through the layer's own Q/DQ), on the first calibration images: memory is one
  image's activations plus ``K x K`` per layer, flat in the folder size.
* The scale per output channel is the nearest-rounding one (``|W|max / 127``): only the rounding moves,
  so the Q/DQ layout and TensorRT's kernels are unchanged.
* A layer keeps its nearest rounding when the chosen one is not lower in ``tr(dW H dW^T)`` on ``H`` (no
  layer gets worse on the activations it was fitted on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgert.backends.onnxruntime import cpu_session
from edgert.calib.collect import _chunks, tensor_bytes
from edgert.calib.histograms import QUANT_LEVELS, safe_amax
from edgert.calib.qdq import GraphPlan, QuantTarget, quantize_weight
from edgert.errors import CalibrationError, reraise_as

__all__ = ["ConvPatches", "conv_layers", "gptq_round", "output_error", "pick_rounding", "weight_roundings"]

log = logging.getLogger(__name__)


class ConvPatches:
    """``H = E[x x^T]`` of one Conv's input patches (quantized with ``amax``), from sampled positions."""

    def __init__(self, node: onnx.NodeProto, weight_shape: Sequence[int], amax: float, per_image: int,
                 seed: int = 0) -> None:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.kernel = tuple(int(k) for k in weight_shape[2:])
        n = len(self.kernel)
        self.strides = tuple(attrs.get("strides", [1] * n))
        self.dilations = tuple(attrs.get("dilations", [1] * n))
        self.pads = tuple(attrs.get("pads", [0] * (2 * n)))
        if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or n != 2:
            raise ValueError("only 2-D convs with explicit pads")
        self.scale = safe_amax(float(amax)) / QUANT_LEVELS
        k = int(np.prod(weight_shape[1:]))
        self.h = np.zeros((k, k), np.float64)
        self.count = 0
        self.per_image = per_image
        self.rng = np.random.default_rng(seed)

    def update(self, x: np.ndarray) -> None:
        xq = np.clip(np.rint(x[0] / self.scale), -QUANT_LEVELS, QUANT_LEVELS).astype(np.float32) * self.scale
        (pt, pl, pb, pr), (kh, kw) = self.pads, self.kernel
        xp = np.pad(xq, ((0, 0), (pt, pb), (pl, pr)))
        (sh, sw), (dh, dw) = self.strides, self.dilations
        oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
        ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
        if oh <= 0 or ow <= 0:
            return
        m = min(self.per_image, oh * ow)
        pos = self.rng.choice(oh * ow, size=m, replace=False)
        rows = (pos // ow)[:, None] * sh + np.arange(kh)[None, :] * dh  # (M, kh)
        cols = (pos % ow)[:, None] * sw + np.arange(kw)[None, :] * dw  # (M, kw)
        patches = xp[:, rows[:, :, None], cols[:, None, :]]  # (C, M, kh, kw)
        p = patches.transpose(1, 0, 2, 3).reshape(m, -1).astype(np.float64)
        self.h += p.T @ p
        self.count += m

    def hessian(self) -> np.ndarray:
        return self.h / max(self.count, 1)


def output_error(w: np.ndarray, wq: np.ndarray, h: np.ndarray) -> float:
    """``tr((wq - w) H (wq - w)^T)``: the summed mean-square output error over the output channels."""
    d = (wq - w).reshape(w.shape[0], -1).astype(np.float64)
    return float(np.einsum("ij,jk,ik->", d, h, d))


def gptq_round(w: np.ndarray, h: np.ndarray, damp: float = 0.01) -> np.ndarray:
    """INT8 values of ``w`` (``[C_out, ...]``, per-output-channel nearest-rounding scales) rounded column by
    column with the error fed forward through ``H^-1`` (see the module doc)."""
    _, scale = quantize_weight(w, 0)
    rows = w.shape[0]
    wf = w.reshape(rows, -1).astype(np.float64).copy()
    k = wf.shape[1]
    hh = h.astype(np.float64).copy()
    dead = np.diag(hh) <= 0
    hh[dead, dead] = 1.0
    hh[np.diag_indices(k)] += damp * float(np.mean(np.diag(hh)))
    try:
        u = np.linalg.cholesky(np.linalg.inv(hh)).T  # upper: the inverse's Cholesky factor, as in GPTQ
    except np.linalg.LinAlgError:
        return quantize_weight(w, 0)[0]
    s = scale.astype(np.float64)
    q = np.zeros((rows, k), np.float64)
    for i in range(k):
        col = wf[:, i]
        qi = np.clip(np.rint(col / s), -QUANT_LEVELS, QUANT_LEVELS)
        q[:, i] = qi
        err = (col - qi * s) / u[i, i]
        if i + 1 < k:
            wf[:, i + 1:] -= np.outer(err, u[i, i + 1:])
    return q.reshape(w.shape).astype(np.int8)


def conv_layers(model: onnx.ModelProto, targets: Iterable[QuantTarget], amax: Mapping[str, float],
                per_image: int) -> tuple[dict[str, ConvPatches], dict[str, str]]:
    """``({node: patch collector}, {node: its input tensor})`` for the quantized group-1 2-D Convs among
    ``targets`` (a :class:`~edgert.calib.qdq.GraphPlan`'s), in the order given (each collector's sampling seed
    is its place in it); shared by the GPTQ step here and AdaRound (:mod:`edgert.calib.adaround`)."""
    inits = {i.name: i for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    layers: dict[str, ConvPatches] = {}
    inputs: dict[str, str] = {}
    for target in targets:
        node = nodes.get(target.node)
        if node is None or node.op_type != "Conv" or target.weight not in inits or not target.activations:
            continue
        if any(a.name == "group" and a.i != 1 for a in node.attribute):
            continue
        try:
            layers[target.node] = ConvPatches(node, list(inits[target.weight].dims), amax[target.activations[0]],
                                              per_image, seed=len(layers))
        except ValueError:
            continue
        inputs[target.node] = target.activations[0]
    return layers, inputs


def pick_rounding(w: np.ndarray, h: np.ndarray, rounder: Callable[[np.ndarray, np.ndarray], np.ndarray],
                  ) -> tuple[np.ndarray | None, dict[str, float]]:
    """``rounder``'s INT8 values for ``w`` where they lower the layer's output error on ``H`` (else None: the
    nearest rounding stays), and both errors relative to the output's power. The scales are the nearest
    rounding's, so only the rounding moves."""
    nearest_q, scale = quantize_weight(w, 0)
    shape = [-1] + [1] * (w.ndim - 1)
    power = max(output_error(np.zeros_like(w), w, h), 1e-30)
    e_near = output_error(w, nearest_q.astype(np.float32) * scale.reshape(shape), h) / power
    chosen = rounder(w, h)
    e_new = output_error(w, chosen.astype(np.float32) * scale.reshape(shape), h) / power
    return (chosen if e_new < e_near else None), {"nearest": e_near, "chosen": min(e_new, e_near)}


def weight_roundings(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
                     feeds: Iterable[Mapping[str, np.ndarray]], per_image: int = 256, budget_mb: float = 512.0,
                     threads: int = 0) -> tuple[dict[str, np.ndarray], dict[str, dict[str, float]]]:
    """``({weight initializer: INT8 values}, {node: {"nearest": e, "chosen": e}})`` for every quantized
    group-1 2-D Conv of ``plan`` whose chosen rounding lowers its output error (``e``: :func:`output_error`
    relative to the layer's output power, on the sampled activations)."""
    inits = {i.name: i for i in model.graph.initializer}
    layers, inputs = conv_layers(model, plan.targets, amax, per_image)
    if not layers:
        return {}, {}
    tensors = sorted(set(inputs.values()))
    graph_inputs = [i.name for i in model.graph.input if i.name not in inits]
    sessions = []
    for chunk in _chunks(tensors, tensor_bytes(model, tensors), int(budget_mb * (1 << 20))):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        del m.graph.output[:]
        fetch = [t for t in chunk if t not in graph_inputs]
        for t in fetch:
            m.graph.output.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
        with reraise_as(CalibrationError, "ONNX Runtime cannot load the model for weight rounding"):
            sess = cpu_session(m, threads, spin_wait=True, what="weight rounding") if fetch else None
        sessions.append((sess, fetch, [t for t in chunk if t in graph_inputs]))
    by_tensor: dict[str, list[ConvPatches]] = {}
    for node, t in inputs.items():
        by_tensor.setdefault(t, []).append(layers[node])
    for feed in feeds:
        for sess, fetch, direct in sessions:
            values = dict(zip(fetch, sess.run(fetch, dict(feed)))) if sess is not None else {}
            values.update({t: feed[t] for t in direct})
            for t, v in values.items():
                for layer in by_tensor[t]:
                    layer.update(np.asarray(v))
            del values
    out: dict[str, np.ndarray] = {}
    errors: dict[str, dict[str, float]] = {}
    weight_of = {t.node: t.weight for t in plan.targets}
    for node, layer in layers.items():
        name = weight_of[node]
        if layer.count == 0 or name is None:
            continue
        w = numpy_helper.to_array(inits[name]).astype(np.float32)
        picked, errors[node] = pick_rounding(w, layer.hessian(), gptq_round)
        if picked is not None:
            out[name] = picked
    if errors:
        gain = [e["nearest"] / max(e["chosen"], 1e-30) for e in errors.values()]
        log.info("weight rounding: %d of %d convs rounded by output error (median error / %.2f)", len(out),
                 len(errors), float(np.median(gain)))
    return out, errors
