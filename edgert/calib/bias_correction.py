"""Empirical bias correction (Nagel et al., "Data-Free Quantization", 2019, section 4.2, empirical form).

Rounding weights to INT8 (and clipping activations) shifts the mean of a layer's output: for a Conv,
``E[(W_q - W) x] = (W_q - W) E[x]`` is not zero when ``E[x]`` is not (ReLU outputs, depthwise layers with
few weights per channel). Per output channel, that shift is measured on the calibration images and
subtracted from the Conv's float bias, which costs nothing at run time (biases stay float in Q/DQ).

Two measurements, both streamed (per-channel sums only: memory flat in the number of images):

* ``local``: each quantized Conv's own shift, from the INT8 twin of :func:`.layer_error.twin_model` (the
  layer's Q/DQ inputs and INT8 weights fed the *FP32* activations), for every layer in one run per image.
  Correcting every layer at once this way does not over-correct: a layer's shift does not include what the
  layers before it add (their own corrections remove that).
* ``output``: the head's output layers (:func:`.sensitivity.output_layers`) measured in the whole Q/DQ model
  (with the local corrections) against FP32: the shift that reaches the decoding tail after every layer's
  error piled up, the one a box offset or a score is made of. Only those layers (none is upstream of
  another), so again nothing is corrected twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Callable

import numpy as np
import onnx
from onnx import helper

from edgert.backends.onnxruntime import cpu_session
from edgert.calib.layer_error import twin_model
from edgert.calib.qdq import GraphPlan, write_qdq
from edgert.errors import CalibrationError, reraise_as

__all__ = ["BIAS_MODES", "bias_corrections"]

log = logging.getLogger(__name__)

#: ``none``, ``local`` (every Conv's own shift), ``output`` (the output layers' whole-model shift), ``both``.
BIAS_MODES = ("none", "local", "output", "both")
_MEAN = "__edgert_mean"


def _session(model: onnx.ModelProto, threads: int) -> object:
    with reraise_as(CalibrationError, "ONNX Runtime cannot load the model for bias correction"):
        return cpu_session(model, threads, spin_wait=True, what="bias correction")


def _channel_means(graph: onnx.GraphProto, tensors: Sequence[str]) -> list[str]:
    """Adds to ``graph`` one output per tensor: its mean per channel (GlobalAveragePool, any spatial rank)."""
    names = []
    for t in tensors:
        name = f"{t}{_MEAN}"
        graph.node.append(helper.make_node("GlobalAveragePool", [t], [name], name=name))
        graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        names.append(name)
    return names


def _convs(model: onnx.ModelProto, plan: GraphPlan, nodes: Iterable[str] | None = None) -> list[str]:
    wanted = None if nodes is None else set(nodes)
    conv = {n.name for n in model.graph.node if n.op_type == "Conv"}
    return [t.node for t in plan.targets if t.node in conv and (wanted is None or t.node in wanted)]


def _mean(sums: np.ndarray, frames: int) -> np.ndarray:
    # (N, C, 1, ...) summed over frames -> (C,): the average over images, batch and positions
    return np.asarray(sums.reshape(sums.shape[0], sums.shape[1], -1).mean(axis=(0, 2)) / max(frames, 1), np.float32)


def local_shifts(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
                 feeds: Iterable[Mapping[str, np.ndarray]], threads: int = 0,
                 rounding: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per quantized Conv: mean per output channel of (FP32 output - INT8 twin's output), FP32 inputs."""
    probe, pairs = twin_model(model, plan, amax, {"rounding": rounding})
    convs = _convs(model, plan)
    if not convs:
        return {}
    g = probe.graph
    diffs = []
    for node in convs:
        ref, twin = pairs[node]
        diff = f"{twin}_bias_diff"
        g.node.append(helper.make_node("Sub", [ref, twin], [diff], name=diff))
        diffs.append(diff)
    names = _channel_means(g, diffs)
    sess = _session(probe, threads)
    sums: list[np.ndarray] | None = None
    frames = 0
    for feed in feeds:
        with reraise_as(CalibrationError, "ONNX Runtime failed on a bias-correction sample"):
            values = sess.run(names, dict(feed))  # type: ignore[attr-defined]
        sums = [np.asarray(v, np.float64) for v in values] if sums is None else [s + v for s, v in zip(sums, values)]
        frames += 1
    if sums is None:
        return {}
    return {node: _mean(s, frames) for node, s in zip(convs, sums)}


def output_shifts(model: onnx.ModelProto, qdq: onnx.ModelProto, nodes: Sequence[str],
                  feeds: Iterable[Mapping[str, np.ndarray]], threads: int = 0) -> dict[str, np.ndarray]:
    """Per node of ``nodes`` (same names in both models): mean per output channel of FP32's output minus the
    Q/DQ model's, each model run on its own (errors of every earlier layer included)."""
    outs = {n.name: n.output[0] for n in model.graph.node if n.name in set(nodes) and n.output}
    chosen = [n for n in nodes if n in outs]
    if not chosen:
        return {}
    sessions = []
    for m in (model, qdq):
        copy = onnx.ModelProto()
        copy.CopyFrom(m)
        del copy.graph.output[:]
        names = _channel_means(copy.graph, [outs[n] for n in chosen])
        sessions.append((_session(copy, threads), names))
    sums: list[np.ndarray] | None = None
    frames = 0
    for feed in feeds:
        ref, got = (sess.run(names, dict(feed)) for sess, names in sessions)  # type: ignore[attr-defined]
        step = [np.asarray(r, np.float64) - np.asarray(q, np.float64) for r, q in zip(ref, got)]
        sums = step if sums is None else [s + d for s, d in zip(sums, step)]
        frames += 1
    if sums is None:
        return {}
    return {node: _mean(s, frames) for node, s in zip(chosen, sums)}


def bias_corrections(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
                     feeds: Callable[[], Iterable[Mapping[str, np.ndarray]]], mode: str = "both",
                     output_nodes: Sequence[str] = (), threads: int = 0,
                     rounding: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per quantized Conv, what to add to its bias (:func:`.qdq.write_qdq`'s ``bias``), for ``mode`` of
    :data:`BIAS_MODES` (``rounding``: the weights' INT8 values, :func:`.qdq.write_qdq`'s). ``feeds``: a
    fresh stream of the calibration images' model inputs per call (one call per measurement, so nothing is
    kept between images)."""
    if mode not in BIAS_MODES:
        raise CalibrationError(f"unknown bias correction {mode!r}; known: {', '.join(BIAS_MODES)}")
    out: dict[str, np.ndarray] = {}
    if mode in ("local", "both"):
        out = local_shifts(model, plan, amax, feeds(), threads, rounding)
    if mode in ("output", "both"):
        heads = _convs(model, plan, output_nodes)
        qdq = write_qdq(model, plan, amax, bias=out, rounding=rounding)
        for node, shift in output_shifts(model, qdq, heads, feeds(), threads).items():
            out[node] = out.get(node, np.zeros_like(shift)) + shift
    if out:
        size = max(float(np.max(np.abs(v))) for v in out.values())
        log.info("bias correction (%s): %d convs, largest shift %.3g", mode, len(out), size)
    return out
