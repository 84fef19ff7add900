"""How much of a model's compute runs in INT8: multiply-accumulates counted from the ONNX shapes.

A Conv / ConvTranspose / Gemm / MatMul runs in INT8 on TensorRT only when its data input *and* its weight
input both come from a DequantizeLinear (explicit quantization: TensorRT fuses DQ -> layer into an INT8
kernel). Its multiply-accumulates are the output elements times the products each one sums:

* Conv: ``prod(output) * C_in / group * prod(kernel)``
* ConvTranspose: ``prod(input) * C_out / group * prod(kernel)`` (each input element is spread over a kernel)
* Gemm / MatMul: ``prod(output) * K`` (K the shared, summed dimension)

Shapes come from ONNX shape inference; where it cannot tell (a Pad whose amounts are computed at run time,
as in YOLOv3-tiny's exported ``ZeroPad2d``), one ONNX Runtime run on a zero input of the model's own input
shape says. Symbolic input dimensions (a dynamic batch) count as 1: the share does not depend on them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from edgert.backends.onnxruntime import cpu_session
from edgert.rewrite.graph import WEIGHTED

__all__ = ["MacCount", "count_macs", "layer_macs"]

log = logging.getLogger(__name__)


@dataclass
class MacCount:
    """Per weighted layer: its multiply-accumulates and whether it runs in INT8."""

    layers: dict[str, int] = field(default_factory=dict)  # node name -> MACs
    int8: set[str] = field(default_factory=set)  # nodes whose data and weight inputs both come from DQ
    unknown: list[str] = field(default_factory=list)  # weighted nodes whose shapes could not be inferred

    @property
    def total(self) -> int:
        return sum(self.layers.values())

    @property
    def int8_macs(self) -> int:
        return sum(m for n, m in self.layers.items() if n in self.int8)

    @property
    def share(self) -> float:
        """Fraction of the MACs in INT8 (1.0 for a model with no weighted layer: nothing runs in float)."""
        return self.int8_macs / self.total if self.total else 1.0

    def to_dict(self) -> dict[str, object]:
        return {"int8_share": round(self.share, 4), "int8_macs": self.int8_macs, "total_macs": self.total,
                "int8_layers": len(self.int8), "layers": len(self.layers), "unknown_shapes": self.unknown}


def _static(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    dims = tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tt.shape.dim)
    return dims if all(d > 0 for d in dims) else None


def _run_shapes(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The shapes of ``names`` from one ONNX Runtime run on zeros (symbolic input dimensions as 1)."""
    import numpy as np

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for t in names:
        if t not in have:
            probe.graph.output.append(onnx.ValueInfoProto(name=t))
    inits = {i.name for i in probe.graph.initializer}
    feeds = {}
    for vi in probe.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        feeds[vi.name] = np.zeros(shape, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    sess = cpu_session(probe, spin_wait=True, optimize=False, what="counting multiply-accumulates")
    outs = sess.run(list(names), feeds)
    return {t: tuple(int(d) for d in o.shape) for t, o in zip(names, outs)}


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # InferenceError or plain errors: count what the graph states itself
        log.info("shape inference failed (%s); MACs from the shapes the graph states", exc)
        inferred = model
    g = inferred.graph
    out: dict[str, tuple[int, ...]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        shape = _static(vi)
        if shape is not None:
            out[vi.name] = shape
    for init in g.initializer:
        out[init.name] = tuple(int(d) for d in init.dims)
    needed = [t for n in g.node if n.op_type in WEIGHTED for t in (n.input[0], n.output[0]) if t and t not in out]
    if needed:
        try:
            out.update(_run_shapes(model, list(dict.fromkeys(needed))))
        except Exception as exc:  # ONNX Runtime's own errors: those layers are then reported as unknown
            log.info("shapes of %d tensor(s) unknown (%s)", len(needed), exc)
    return out


def _prod(xs: Sequence[int]) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


def layer_macs(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """Multiply-accumulates of one weighted node, or None when a shape it needs is unknown."""
    op = node.op_type
    ins = list(node.input)
    if len(ins) < 2 or not node.output:
        return None
    x, w, y = shapes.get(ins[0]), shapes.get(ins[1]), shapes.get(node.output[0])
    if op == "Conv":
        if w is None or y is None or len(w) < 2:
            return None
        return _prod(y) * int(w[1]) * _prod(w[2:])  # w: (C_out, C_in / group, k...)
    if op == "ConvTranspose":
        if w is None or x is None or len(w) < 2:
            return None
        return _prod(x) * int(w[1]) * _prod(w[2:])  # w: (C_in, C_out / group, k...)
    if op in ("Gemm", "MatMul"):
        if x is None or y is None or not x:
            return None
        if op == "Gemm":
            trans_a = next((int(a.i) for a in node.attribute if a.name == "transA"), 0)
            k = int(x[0] if trans_a else x[-1])
        else:
            k = int(x[-1])
        return _prod(y) * k
    return None


def count_macs(model: onnx.ModelProto) -> MacCount:
    """The MACs of every Conv / ConvTranspose / Gemm / MatMul of ``model`` and which run in INT8."""
    shapes = _shapes(model)
    producer = {t: n for n in model.graph.node for t in n.output}
    result = MacCount()
    for i, node in enumerate(model.graph.node):
        if node.op_type not in WEIGHTED:
            continue
        name = node.name or f"{node.op_type}_{i}"
        macs = layer_macs(node, shapes)
        if macs is None:
            result.unknown.append(name)
            continue
        result.layers[name] = macs
        srcs = [producer.get(t) for t in node.input[:2]]
        if all(s is not None and s.op_type == "DequantizeLinear" for s in srcs):
            result.int8.add(name)
    return result
