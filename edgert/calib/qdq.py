"""Where INT8 goes in a graph, and writing the explicitly quantized (Q/DQ) ONNX that TensorRT takes.

Placement follows TensorRT's explicit-quantization guide: quantize the inputs of weighted layers
(Conv, ConvTranspose, Gemm, MatMul: activations per tensor, weights per output channel), the inputs of
pooling layers, and the residual input of an ``Add`` that TensorRT can fuse into the Conv producing its
other input; leave layer outputs alone (TensorRT fuses DQ -> layer -> Q itself). Everything is
symmetric INT8 with zero point 0 and biases stay float: TensorRT's ONNX parser rejects non-zero zero
points and INT32 biases.

What stays float, because INT8 there breaks the model rather than speeding it up:

* the decoding tail: every node after the last Conv on the way to the outputs, where a Conv that
  reads a Softmax (YOLOv8's DFL, an expectation over box-offset bins) counts as decoding. A detector's decoding
  (box distances, softmax over bins, class scores concatenated with pixel coordinates) needs more than
  one 8-bit scale can hold: NanoDet's single output holds coordinates up to ~420 px and scores of 0..1.
* tensors padded with ``-inf`` (a ``Pad`` whose constant is not finite, before a MaxPool): their range is
  infinite by construction.
* anything whose weights are computed at run time rather than stored, and non-float tensors.
"""

from __future__ import annotations

import copy
import logging
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgert.calib.histograms import QUANT_LEVELS, safe_amax
from edgert.errors import CalibrationError
from edgert.rewrite.graph import WEIGHTED, activation_graph, name_nodes

__all__ = [
    "DEFAULT_OPS",
    "PLACEMENT_VERSION",
    "GraphPlan",
    "QuantTarget",
    "plan_quantization",
    "prepare_model",
    "quantize_weight",
    "shared_ranges",
    "weighted_inputs",
    "write_qdq",
]

log = logging.getLogger(__name__)

#: Layer types whose inputs get Q/DQ by default (TensorRT's explicit-quantization guide).
DEFAULT_OPS: tuple[str, ...] = (
    "Conv", "ConvTranspose", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool", "Add",
)
_POOLS = ("MaxPool", "AveragePool", "GlobalAveragePool")
#: Raised when the placement rules change, so a calibration written by the earlier rules is not "up to date"
#: (2: residual Adds after a Conv's activation, YOLOv8's SiLU shortcuts).
PLACEMENT_VERSION = 2
MIN_OPSET = 13  # per-channel DequantizeLinear (axis) needs opset 13


@dataclass(frozen=True)
class QuantTarget:
    """One layer that runs in INT8: which of its inputs are quantized, and how."""

    node: str
    op_type: str
    activations: tuple[str, ...]  # input tensors quantized per tensor
    weight: str | None = None  # initializer quantized per channel
    weight_axis: int = 0


@dataclass
class GraphPlan:
    """The quantization plan of one model (node names as in :func:`prepare_model`'s output)."""

    targets: list[QuantTarget]
    activation_tensors: list[str]  # float tensors computed from the inputs, in graph order (inputs first)
    tail_nodes: list[str]  # kept float: after the last Conv on the way to the outputs
    tail_tensors: set[str]  # outputs of the tail nodes
    nonfinite_tensors: set[str]  # -inf padding and the like
    skipped: dict[str, str] = field(default_factory=dict)  # node -> why it stays float

    @property
    def quantized_tensors(self) -> list[str]:
        """Activation tensors that get a Q/DQ pair, in graph order."""
        wanted = {t for target in self.targets for t in target.activations}
        return [t for t in self.activation_tensors if t in wanted]

    def cache_tensors(self) -> list[str]:
        """Tensors a TensorRT calibration cache lists: every finite activation outside the tail."""
        return [t for t in self.activation_tensors if t not in self.tail_tensors and t not in self.nonfinite_tensors]


# --------------------------------------------------------------------------------------------------
# Model preparation and analysis


def _opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def prepare_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every node named uniquely, opset >= 13 and tensor types inferred."""
    model = copy.deepcopy(model)
    if _opset(model) < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as exc:  # the converter raises plain RuntimeErrors for unsupported ops
            raise CalibrationError(
                f"cannot raise the model's opset from {_opset(model)} to {MIN_OPSET} for per-channel INT8: {exc}. "
                "Note: re-export the model with opset >= 13"
            ) from exc
    name_nodes(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # onnx raises InferenceError or plain errors; either way types are optional
        log.warning("shape inference failed (%s); tensor types come from the graph alone", exc)
        inferred = model
    return inferred


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    out = set()
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            out.add(vi.name)
    return out


def constant_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of ``name`` when it is an initializer or a Constant node's output; None otherwise."""
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
    return None


def _pads_nonfinite(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """A constant-mode Pad whose fill value is +-inf or nan."""
    mode = "constant"
    value: float | None = 0.0
    for attr in node.attribute:
        if attr.name == "mode":
            mode = attr.s.decode() if isinstance(attr.s, bytes) else str(attr.s)
        elif attr.name == "value":  # opset < 11
            value = float(attr.f)
    if mode != "constant":
        return False
    if len(node.input) > 2 and node.input[2]:
        arr = constant_value(model, node.input[2])
        value = float(arr.reshape(-1)[0]) if arr is not None and arr.size else None
        if value is None:
            return False
    return value is not None and not math.isfinite(value)


def plan_quantization(model: onnx.ModelProto, ops: Collection[str] = DEFAULT_OPS,
                      exclude_nodes: Collection[str] = (), nonfinite: Collection[str] = ()) -> GraphPlan:
    """Decide which layers run in INT8. ``model`` must come from :func:`prepare_model`."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    floats = _float_tensors(model) | {n for n, i in inits.items() if i.data_type == TensorProto.FLOAT}
    graph_inputs = [i.name for i in g.input if i.name not in inits]

    # Activations, producers and consumers, and the layers the decoding tail comes after (edgert.rewrite.graph:
    # the FP16 conversion keeps the same tail in float).
    act = activation_graph(model)
    dynamic, producer, dynamic_nodes = act.dynamic, act.producer, act.dynamic_nodes
    tail_nodes, tail_tensors = act.tail_nodes, act.tail_tensors
    tail = set(tail_nodes)

    bad = set(nonfinite)
    for node in dynamic_nodes:
        if node.op_type == "Pad" and _pads_nonfinite(model, node):
            bad.update(t for t in node.output if t)

    activation_tensors = [t for t in graph_inputs if t in floats]
    activation_tensors += [t for n in dynamic_nodes for t in n.output if t and t in floats]

    def is_act(t: str) -> bool:
        return t in dynamic and t in floats and t not in inits

    def weight_ok(t: str) -> bool:
        return t in inits and inits[t].data_type == TensorProto.FLOAT

    targets: list[QuantTarget] = []
    skipped: dict[str, str] = {}
    excluded = set(exclude_nodes)
    wanted = set(ops)
    for node in dynamic_nodes:
        op = node.op_type
        if op not in wanted:
            continue
        if node.name in tail:
            skipped[node.name] = "decoding tail (after the last Conv)"
            continue
        if node.name in excluded:
            skipped[node.name] = "left in float (sensitivity or user choice)"
            continue
        acts: list[str] = []
        weight: str | None = None
        axis = 0
        if op in WEIGHTED:
            found = weighted_inputs(node, inits, weight_ok)
            if found is None:
                skipped[node.name] = "weights are not a constant float tensor"
                continue
            weight, axis, acts = found
        elif op in _POOLS:
            acts = [node.input[0]]
        elif op == "Add":
            ins = [t for t in node.input if t]
            if len(ins) != 2 or not all(is_act(t) for t in ins):
                continue  # adding a constant (bias, offset): nothing to fuse
            # the branch TensorRT fuses the Add into: a weighted layer's output, or its activation's when only the
            # Add reads it; the other input is the residual, quantized so the fused layer emits INT8
            fuses = [(producer.get(t) is not None and producer[t].op_type in WEIGHTED)
                     or (_from_weighted(t, producer) and len(act.consumers.get(t, ())) == 1) for t in ins]
            if not any(fuses) or all(fuses):
                continue
            acts = [t for t, f in zip(ins, fuses) if not f]
        else:  # a user-listed op: quantize its float activation inputs
            acts = [t for t in node.input if t]
        if any(t in bad for t in acts):
            skipped[node.name] = "input holds non-finite padding (-inf)"
            continue
        if not all(is_act(t) for t in acts):
            skipped[node.name] = "an input is not a float activation"
            continue
        targets.append(QuantTarget(node.name, op, tuple(acts), weight, axis))
    return GraphPlan(targets, activation_tensors, tail_nodes, tail_tensors, bad, skipped)


#: Activations TensorRT fuses into the Conv before them (its pointwise fusion), so an ``Add`` after one still
#: fuses into that Conv.
_FUSED_ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
                      "Softplus", "Mish")


def _from_weighted(tensor: str, producer: Mapping[str, onnx.NodeProto], depth: int = 3) -> bool:
    """Whether ``tensor`` comes from a weighted layer directly or through its activation: ``Conv -> Relu``, or
    YOLOv5/v8's SiLU, ``Conv -> Sigmoid -> Mul(conv, sigmoid)``, which TensorRT fuses into the Conv; an ``Add``
    of it and a residual then fuses there too, and emits INT8 when the residual input is quantized (TensorRT's
    Q/DQ placement guide). Seen missing on YOLOv8s: every C2f shortcut stayed float."""
    node = producer.get(tensor)
    if node is None or depth == 0:
        return False
    if node.op_type in WEIGHTED:
        return True
    if node.op_type in _FUSED_ACTIVATIONS:
        return _from_weighted(node.input[0], producer, depth - 1)
    if node.op_type == "Mul" and len(node.input) == 2:  # x * sigmoid(x)
        a, b = node.input
        for x, gate in ((a, b), (b, a)):
            g = producer.get(gate)
            if g is not None and g.op_type == "Sigmoid" and g.input[0] == x:
                return _from_weighted(x, producer, depth - 1)
    return False


def weighted_inputs(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto],
                    weight_ok: Callable[[str], bool]) -> tuple[str | None, int, list[str]] | None:
    """``(weight, per-channel axis, activation inputs)`` of a node of ``rewrite.graph.WEIGHTED``.

    The weight is a constant float tensor (``weight_ok``): Conv's input 1 (axis 0; ConvTranspose: axis 1,
    or -1, per tensor, when grouped), Gemm's input 1 (axis 0 with transB, else 1), MatMul's 2-D input 1
    (axis 1: one scale per output column). A Gemm/MatMul of two activations (attention) has no weight and
    both inputs as activations; a Conv whose weights are not constant gives None. One reading of these
    layouts for every planner (detectors in :func:`plan_quantization`, Whisper in ``calib.whisper``).
    """
    op = node.op_type
    if op in ("Conv", "ConvTranspose"):
        if len(node.input) < 2 or not weight_ok(node.input[1]):
            return None
        group = next((int(a.i) for a in node.attribute if a.name == "group"), 1)
        return node.input[1], (0 if op == "Conv" else (1 if group == 1 else -1)), [node.input[0]]
    if op == "Gemm":
        trans_b = next((int(a.i) for a in node.attribute if a.name == "transB"), 0)
        if weight_ok(node.input[1]):
            return node.input[1], (0 if trans_b else 1), [node.input[0]]
        return None, 0, [node.input[0], node.input[1]]
    if op == "MatMul":
        second = node.input[1]
        if weight_ok(second) and len(inits[second].dims) == 2:
            return second, 1, [node.input[0]]
        return None, 0, list(node.input[:2])
    raise ValueError(f"{op} has no weight input")


#: Ops TensorRT moves a quantization across (their output is on their input's INT8 grid), so the
#: tensors on both sides are best quantized with one scale: then no value is rounded twice.
PASS_THROUGH = ("Concat", "MaxPool", "Resize", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
                "Identity", "Slice", "Split")


def shared_ranges(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
                  ops: Collection[str] = ("Concat", "MaxPool")) -> dict[str, float]:
    """``amax`` with every quantized tensor of one group sharing the group's largest range.

    A group joins the inputs and outputs of ``ops`` (Concat: TensorRT needs one scale on all its inputs
    to fuse it away; MaxPool: the pooled values are the input's, so a second, different scale rounds them
    twice). Tensors outside any group keep their ranges.
    """
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            parent[t] = parent.get(parent[t], parent[t])
            t = parent[t]
        return t

    tail = set(plan.tail_nodes)
    wanted = set(ops)
    for node in model.graph.node:
        if node.op_type not in wanted or node.name in tail:
            continue
        members = [t for t in (*node.input, *node.output) if t and t in amax]
        if node.op_type != "Concat":
            members = [t for t in (node.input[0], *node.output) if t in amax] if node.input else []
        for t in members[1:]:
            a, b = find(members[0]), find(t)
            if a != b:
                parent[b] = a
    groups: dict[str, list[str]] = {}
    for t in amax:
        groups.setdefault(find(t), []).append(t)
    out = dict(amax)
    for members in groups.values():
        top = max(float(amax[t]) for t in members)
        for t in members:
            out[t] = top
    return out


# --------------------------------------------------------------------------------------------------
# Writing


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric INT8 per channel along ``axis`` (``-1``: one scale): ``(int8 values, scales)``."""
    w = np.asarray(w, dtype=np.float32)
    if axis < 0 or w.ndim == 0:
        amax = np.array(float(np.max(np.abs(w))) if w.size else 0.0, dtype=np.float32)
        scale = np.array(safe_amax(float(amax)) / QUANT_LEVELS, dtype=np.float32)
        q = np.clip(np.rint(w / scale), -QUANT_LEVELS, QUANT_LEVELS).astype(np.int8)
        return q, scale
    other = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w), axis=other) if other else np.abs(w)
    amax = np.where(amax > 0, amax, 1.0).astype(np.float32)  # an all-zero channel: any scale is exact
    scale = (amax / QUANT_LEVELS).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -QUANT_LEVELS, QUANT_LEVELS).astype(np.int8)
    return q, scale


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:/-]", "_", name)


def write_qdq(model: onnx.ModelProto, plan: GraphPlan, amax: Mapping[str, float],
              exclude_nodes: Iterable[str] = (), metadata: Mapping[str, str] | None = None) -> onnx.ModelProto:
    """The Q/DQ model: ``plan``'s targets (minus ``exclude_nodes``) quantized with ranges ``amax`` (weights
    per output channel, rounded to nearest; biases float)."""
    excluded = set(exclude_nodes)
    targets = {t.node: t for t in plan.targets if t.node not in excluded}
    missing = sorted({a for t in targets.values() for a in t.activations if a not in amax})
    if missing:
        raise CalibrationError(f"no calibration range for tensor(s) {', '.join(missing[:5])}")
    out = copy.deepcopy(model)
    g = out.graph
    inits = {i.name: i for i in g.initializer}
    taken = {*inits, *(t for n in g.node for t in (*n.input, *n.output)), *(i.name for i in g.input)}

    def fresh(base: str) -> str:
        name, k = _safe(base), 1
        while name in taken:
            name, k = f"{_safe(base)}_{k}", k + 1
        taken.add(name)
        return name

    new_inits: list[onnx.TensorProto] = []
    act_dq: dict[str, str] = {}  # activation -> its DequantizeLinear output
    weight_dq: dict[tuple[str, int], str] = {}
    nodes: list[onnx.NodeProto] = []

    def emit_activation(t: str) -> str:
        if t in act_dq:
            return act_dq[t]
        scale = np.float32(safe_amax(float(amax[t])) / QUANT_LEVELS)
        s_name, z_name = fresh(f"{t}_scale"), fresh(f"{t}_zero_point")
        new_inits.append(numpy_helper.from_array(np.array(scale, np.float32), s_name))
        new_inits.append(numpy_helper.from_array(np.array(0, np.int8), z_name))
        q_out, dq_out = fresh(f"{t}_QuantizeLinear"), fresh(f"{t}_DequantizeLinear")
        nodes.append(helper.make_node("QuantizeLinear", [t, s_name, z_name], [q_out], name=fresh(f"{t}_Q")))
        nodes.append(helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out], name=fresh(f"{t}_DQ")))
        act_dq[t] = dq_out
        return dq_out

    def emit_weight(w: str, axis: int) -> str:
        key = (w, axis)
        if key in weight_dq:
            return weight_dq[key]
        q, scale = quantize_weight(numpy_helper.to_array(inits[w]), axis)
        q_name, s_name, z_name = fresh(f"{w}_quantized"), fresh(f"{w}_scale"), fresh(f"{w}_zero_point")
        new_inits.append(numpy_helper.from_array(q, q_name))
        new_inits.append(numpy_helper.from_array(scale, s_name))
        new_inits.append(numpy_helper.from_array(np.zeros(scale.shape, np.int8), z_name))
        dq_out = fresh(f"{w}_DequantizeLinear")
        dq = helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [dq_out], name=fresh(f"{w}_DQ"))
        if scale.ndim == 1:
            dq.attribute.append(helper.make_attribute("axis", axis))
        nodes.append(dq)
        weight_dq[key] = dq_out
        return dq_out

    for node in g.node:
        target = targets.get(node.name)
        if target is not None:
            for i, t in enumerate(node.input):
                if t in target.activations:
                    node.input[i] = emit_activation(t)
                elif target.weight is not None and t == target.weight and i > 0:
                    node.input[i] = emit_weight(t, target.weight_axis)
        nodes.append(node)

    # Float weights every user of which now reads the INT8 copy are dropped (the file shrinks ~4x).
    still_used = {t for n in nodes for t in n.input} | {o.name for o in g.output}
    kept = [i for i in g.initializer if i.name in still_used]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    del g.value_info[:]  # stale after rewiring; ONNX Runtime and TensorRT infer them again
    for key, value in (metadata or {}).items():
        prop = next((p for p in out.metadata_props if p.key == key), None)
        if prop is None:
            prop = out.metadata_props.add()
            prop.key = key
        prop.value = value
    return out
