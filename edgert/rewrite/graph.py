"""What the FP16 conversion and the INT8 calibrator both need to know about a detector graph.

The *activations* are the tensors computed (transitively) from the graph inputs: shape and constant
subgraphs (NanoDet builds its anchor grid from initializers) are not. The *decoding tail* is what comes
after the last layer on the way to the outputs (box arithmetic, score transforms): it stays in float32 in
both rewrites. A Conv or MatMul that reads a Softmax (through shape-only ops) is decoding, not a layer:
YOLOv8's DFL conv and NanoDet's projection take the expectation of a distribution over box offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

__all__ = ["SHAPE_OPS", "WEIGHTED", "ActivationGraph", "activation_graph", "name_nodes", "reads_softmax"]

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
SHAPE_OPS = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def reads_softmax(node: onnx.NodeProto, producer: Mapping[str, onnx.NodeProto]) -> bool:
    """Whether ``node``'s first input is a Softmax output, possibly reshaped or transposed."""
    src = producer.get(node.input[0]) if node.input else None
    while src is not None and src.op_type in SHAPE_OPS:
        src = producer.get(src.input[0]) if src.input else None
    return src is not None and src.op_type == "Softmax"


@dataclass
class ActivationGraph:
    """The activation tensors and nodes of a graph, who produces and who reads each tensor, and which nodes
    are layers or feed one (``anchored``; the others are the decoding tail)."""

    dynamic: set[str] = field(default_factory=set)
    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)
    consumers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    dynamic_nodes: list[onnx.NodeProto] = field(default_factory=list)
    anchored: set[str] = field(default_factory=set)

    @property
    def tail_nodes(self) -> list[str]:
        """Names of the activation nodes after the last layer, in graph order. Empty when there is no layer to
        anchor on: a graph without layers has no decoding tail, it is all body. The one definition of the tail
        for the FP16 rewrite and the INT8 planner (they must keep the same nodes float)."""
        if not self.anchored:
            return []
        return [n.name for n in self.dynamic_nodes if n.name not in self.anchored]

    @property
    def tail_tensors(self) -> set[str]:
        """The outputs of :attr:`tail_nodes`."""
        tail = set(self.tail_nodes)
        return {t for n in self.dynamic_nodes if n.name in tail for t in n.output if t}


def activation_graph(model: onnx.ModelProto) -> ActivationGraph:
    """Walk ``model`` once (nodes must be named). Models without convolutions anchor on Gemm/MatMul."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    out = ActivationGraph(dynamic={i.name for i in g.input if i.name not in inits})
    for node in g.node:
        for t in node.input:
            out.consumers.setdefault(t, []).append(node)
        for t in node.output:
            out.producer[t] = node
        if any(t in out.dynamic for t in node.input):
            out.dynamic_nodes.append(node)
            out.dynamic.update(t for t in node.output if t)
    decoding = {n.name for n in out.dynamic_nodes if n.op_type in WEIGHTED and reads_softmax(n, out.producer)}
    anchor_ops: tuple[str, ...] = ("Conv", "ConvTranspose")
    if not any(n.op_type in anchor_ops and n.name not in decoding for n in out.dynamic_nodes):
        anchor_ops = ("Gemm", "MatMul")
    for node in reversed(list(g.node)):
        if (node.op_type in anchor_ops and node.name not in decoding) or any(
            c.name in out.anchored for t in node.output for c in out.consumers.get(t, [])
        ):
            out.anchored.add(node.name)
    return out


def name_nodes(model: onnx.ModelProto) -> None:
    """Name every node of ``model`` uniquely, in place (unnamed ones ``Op_i``): block lists, Q/DQ plans and
    reports go by node name."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)
