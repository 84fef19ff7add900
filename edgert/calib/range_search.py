"""Each activation's INT8 range chosen by the output error of the layers that read it, in one run per frame.

A histogram method (percentile, MSE of the tensor itself) judges a range by how well it keeps the *tensor*;
what matters is how well the layer reading it keeps its *output*: clipping a rare large input may cost the
output little, and a wide range may cost every small value its precision. So for every quantized activation
tensor, a few candidate ranges from its histogram (percentiles, the tensor's own MSE minimum, its maximum)
are tried on its consumers at once: the probe model is the FP32 model plus, per candidate and consumer, a
twin of the consumer that reads the FP32 tensor through a Q/DQ pair at the candidate's scale (and its own
INT8 weights), ending in the summed squared difference from the FP32 output. One ONNX Runtime run per frame
scores every candidate of every tensor; each tensor takes the candidate whose consumers' noise-to-signal
ratios sum lowest. Inputs are exact, so each choice is the layer's own (as in :mod:`.layer_error`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgert.backends.onnxruntime import cpu_session
from edgert.calib.histograms import QUANT_LEVELS, TensorHistogram, safe_amax
from edgert.calib.qdq import GraphPlan, write_qdq

__all__ = ["CANDIDATES", "candidate_ranges", "search_ranges"]

log = logging.getLogger(__name__)

#: The candidate ranges of each tensor, from its histogram: (method, percentile).
CANDIDATES: tuple[tuple[str, float], ...] = (
    ("percentile", 99.9), ("percentile", 99.99), ("percentile", 99.999), ("percentile", 99.9999),
    ("mse", 0.0), ("minmax", 0.0),
)
_SUFFIX = "__edgert_rs"


def candidate_ranges(hist: TensorHistogram, default: float) -> list[float]:
    """Distinct candidate ``amax`` values of one tensor (``default``, the configured method's, first)."""
    out = [float(default)]
    for method, pct in CANDIDATES:
        value = float(hist.amax(method, pct))  # type: ignore[arg-type]
        if value > 0 and all(abs(value - v) > 1e-6 * max(v, 1e-12) for v in out):
            out.append(value)
    return out


def _probe(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
           candidates: Mapping[str, Sequence[float]], write_kwargs: Mapping[str, Any] | None
           ) -> tuple[onnx.ModelProto, dict[tuple[str, int], list[tuple[str, str]]]]:
    """The probe: per (tensor, candidate index), the (error, signal) outputs of each consumer's twin."""
    qdq = write_qdq(model, plan, amax, **dict(write_kwargs or {}))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    g = probe.graph
    have = {i.name for i in g.initializer}
    g.initializer.extend(i for i in qdq.graph.initializer if i.name not in have)
    fp32_nodes = {n.name for n in model.graph.node}
    # the INT8 weights' DequantizeLinear nodes (they read initializers only)
    g.node.extend(n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.name not in fp32_nodes
                  and all(t in {i.name for i in qdq.graph.initializer} for t in n.input if t))
    by_node = {t.node: t for t in plan.targets}
    qnodes = {n.name: n for n in qdq.graph.node if n.name in by_node}
    fnodes = {n.name: n for n in model.graph.node}
    outputs: dict[tuple[str, int], list[tuple[str, str]]] = {}
    signal: dict[str, str] = {}
    for tensor, values in candidates.items():
        users = [t for t in plan.targets if tensor in t.activations and t.node in qnodes]
        for k, value in enumerate(values):
            tag = f"{tensor}{_SUFFIX}{k}"
            scale, zero, q, dq = (f"{tag}_{s}" for s in ("scale", "zero", "q", "dq"))
            g.initializer.extend([numpy_helper.from_array(np.array(safe_amax(value) / QUANT_LEVELS, np.float32), scale),
                                  numpy_helper.from_array(np.array(0, np.int8), zero)])
            g.node.extend([helper.make_node("QuantizeLinear", [tensor, scale, zero], [q], name=q),
                           helper.make_node("DequantizeLinear", [q, scale, zero], [dq], name=dq)])
            for target in users:
                fp, qn = fnodes[target.node], qnodes[target.node]
                twin = onnx.NodeProto()
                twin.CopyFrom(qn)
                twin.name = f"{target.node}{_SUFFIX}{tensor}{k}"
                for i, name in enumerate(fp.input):
                    if name == tensor:
                        twin.input[i] = dq
                    elif name in target.activations:
                        twin.input[i] = name  # another quantized input of the node: left exact here
                del twin.output[:]
                twin.output.append(twin.name + "_out")
                ref = fp.output[0]
                diff, err = twin.name + "_diff", twin.name + "_err"
                g.node.extend([twin, helper.make_node("Sub", [twin.output[0], ref], [diff], name=diff),
                               helper.make_node("ReduceSumSquare", [diff], [err], name=err, keepdims=0)])
                if ref not in signal:
                    signal[ref] = ref + _SUFFIX + "_sig"
                    g.node.append(helper.make_node("ReduceSumSquare", [ref], [signal[ref]], name=signal[ref],
                                                   keepdims=0))
                outputs.setdefault((tensor, k), []).append((err, signal[ref]))
    del g.output[:]
    names = {n for pairs in outputs.values() for pair in pairs for n in pair}
    g.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, []) for n in sorted(names))
    return probe, outputs


def search_ranges(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
                  histograms: Mapping[str, TensorHistogram], feeds: Iterable[Mapping[str, np.ndarray]],
                  threads: int = 0, write_kwargs: Mapping[str, Any] | None = None
                  ) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """``(amax with each quantized tensor's range replaced by its best candidate, per tensor what was tried)``.

    ``feeds``: model inputs of the frames the output errors are summed over (calibration images)."""

    candidates = {t: candidate_ranges(histograms[t], amax[t]) for t in plan.quantized_tensors if t in histograms}
    candidates = {t: v for t, v in candidates.items() if len(v) > 1}
    if not candidates:
        return dict(amax), {}
    probe, outputs = _probe(model, plan, amax, candidates, write_kwargs)
    sess = cpu_session(probe, threads, spin_wait=True, what="choosing ranges by output error")
    names = [o.name for o in probe.graph.output]
    sums = np.zeros(len(names), np.float64)
    for feed in feeds:
        sums += np.asarray([float(v) for v in sess.run(names, dict(feed))], np.float64)
    total = dict(zip(names, sums))
    chosen = dict(amax)
    info: dict[str, dict[str, Any]] = {}
    for tensor, values in candidates.items():
        nsr = [sum(total[e] / total[s] if total[s] > 0 else float(total[e] > 0) for e, s in outputs[(tensor, k)])
               for k in range(len(values))]
        best = int(np.argmin(nsr))
        chosen[tensor] = values[best]
        info[tensor] = {"candidates": [round(v, 6) for v in values], "nsr": [float(f"{x:.4g}") for x in nsr],
                        "chosen": round(values[best], 6), "default": round(values[0], 6)}
    changed = sum(1 for i in info.values() if i["chosen"] != i["default"])
    log.info("ranges by output error: %d of %d tensors moved from the %s range", changed, len(info), "default")
    return chosen, info
