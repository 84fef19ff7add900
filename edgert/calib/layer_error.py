"""Every quantized layer's own INT8 error, from one run of one model.

The probe model is the FP32 model plus, for each layer of the plan, an INT8 twin: the same node reading the
FP32 activations through the Q/DQ pairs (and the INT8 weights) the calibrated model would give it. Each twin
ends in two scalars, the summed squared difference from the float layer's output and the summed square of
that output, so one ONNX Runtime run per frame gives every layer's noise-to-signal ratio (NSR) at once.
Running the whole model once per candidate layer (the pass this replaces) cost N runs for N layers.

The error is the layer's own: its inputs are exact, so errors of the layers before it do not pile up in it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import helper

from edgert.backends.onnxruntime import cpu_session
from edgert.calib.qdq import GraphPlan, write_qdq

__all__ = ["layer_errors", "probe_model", "twin_model"]

log = logging.getLogger(__name__)

_SUFFIX_Q = "__edgert_int8"


def twin_model(model: onnx.ModelProto, plan: GraphPlan,
               amax: Mapping[str, float]) -> tuple[onnx.ModelProto, dict[str, tuple[str, str]]]:
    """``(model with twins, {node: (FP32 output, INT8 twin's output)})`` for every target of ``plan``: each
    twin is the node as the Q/DQ model (:func:`.qdq.write_qdq`) has it, reading the FP32
    activations through its Q/DQ pairs. The graph outputs are left to the caller."""
    qdq = write_qdq(model, plan, amax)
    targets = {t.node for t in plan.targets}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    g = probe.graph
    have = {i.name for i in g.initializer}
    g.initializer.extend(i for i in qdq.graph.initializer if i.name not in have)
    fp32_nodes = {n.name: n for n in model.graph.node}
    pairs: dict[str, tuple[str, str]] = {}
    extra: list[onnx.NodeProto] = []
    for node in qdq.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.name not in fp32_nodes:
            extra.append(node)  # reads FP32 tensors (activations) or INT8 initializers (weights)
    for node in qdq.graph.node:
        if node.name not in targets or not node.output:
            continue
        ref = node.output[0]
        twin = onnx.NodeProto()
        twin.CopyFrom(node)
        twin.name = node.name + _SUFFIX_Q
        del twin.output[:]
        twin.output.append(ref + _SUFFIX_Q)
        extra.append(twin)
        pairs[node.name] = (ref, twin.output[0])
    g.node.extend(extra)
    del g.output[:]
    return probe, pairs


def probe_model(model: onnx.ModelProto, plan: GraphPlan,
                amax: Mapping[str, float]) -> tuple[onnx.ModelProto, dict[str, tuple[str, str]]]:
    """``(probe, {node: (error output, signal output)})`` for every target of ``plan`` (see the module doc)."""
    probe, pairs = twin_model(model, plan, amax)
    g = probe.graph
    outputs: dict[str, tuple[str, str]] = {}
    for node, (ref, twin) in pairs.items():
        diff, err, sig = (f"{ref}{_SUFFIX_Q}_{k}" for k in ("diff", "err", "sig"))
        g.node.extend([helper.make_node("Sub", [twin, ref], [diff], name=diff),
                       helper.make_node("ReduceSumSquare", [diff], [err], name=err, keepdims=0),
                       helper.make_node("ReduceSumSquare", [ref], [sig], name=sig, keepdims=0)])
        outputs[node] = (err, sig)
    for err, sig in outputs.values():
        g.output.append(helper.make_tensor_value_info(err, onnx.TensorProto.FLOAT, []))
        g.output.append(helper.make_tensor_value_info(sig, onnx.TensorProto.FLOAT, []))
    return probe, outputs


def layer_errors(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
                 feeds: Iterable[Mapping[str, np.ndarray]], threads: int = 0) -> dict[str, float]:
    """Per target node of ``plan``: its output's INT8 NSR (sum of squared error / sum of square) over ``feeds``."""

    probe, outputs = probe_model(model, plan, amax)
    sess = cpu_session(probe, threads, spin_wait=True, what="measuring layer errors")
    names = [n for pair in outputs.values() for n in pair]
    sums = np.zeros(len(names), np.float64)
    for feed in feeds:
        sums += np.asarray([float(v) for v in sess.run(names, dict(feed))], np.float64)
    total = dict(zip(names, sums))
    return {node: float(total[e] / total[s]) if total[s] > 0 else float(total[e] > 0)
            for node, (e, s) in outputs.items()}
