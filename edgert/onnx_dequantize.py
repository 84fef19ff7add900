"""A Q/DQ model's float twin: the same graph with its quantization taken out.

- every DequantizeLinear of a constant (INT8 weights, per-tensor or per-channel scales) becomes the float
  weights it computes;
- with ``activations``, every QuantizeLinear -> DequantizeLinear pair on a computed tensor becomes that tensor.

The demo's FP32 model is the packaged INT8 one with its weights dequantized. The batch-rewrite check runs a
quantized model's twins: a rewrite moves the batch through the graph's shape operators and leaves the Q/DQ
nodes as they are, while rounding to INT8 turns the last-bit differences of another batch size's convolution
kernels into whole quantization steps (a YOLOv8s row differed by 1.7 % on an Intel Xeon, by nothing on an AMD
EPYC), so the exact comparison is made where no rounding amplifies them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["DequantizeError", "dequantized"]


class DequantizeError(ValueError):
    """A Q/DQ node has no float twin (a QuantizeLinear whose INT8 output another operator reads, say)."""


def _constants(graph: onnx.GraphProto, names: set[str]) -> dict[str, np.ndarray]:
    """The constant tensors among ``names`` (initializers and Constant nodes), as arrays."""
    found = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in names}
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in names:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                found[node.output[0]] = numpy_helper.to_array(value)
    return found


def _weights(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> np.ndarray:
    q = consts[node.input[0]].astype(np.float32)
    scale = consts[node.input[1]]
    dtype = scale.dtype
    scale = scale.astype(np.float32)
    zero = (consts[node.input[2]].astype(np.float32) if len(node.input) > 2 and node.input[2]
            else np.zeros_like(scale))
    if scale.ndim == 1 and scale.size > 1 and q.ndim > 1:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    weights: np.ndarray = ((q - zero) * scale).astype(dtype)
    return weights


def dequantized(model: onnx.ModelProto, activations: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` without its Q/DQ nodes (see the module's docstring); raises :class:`DequantizeError`
    where one is left that has no float twin."""
    graph = model.graph
    consts = _constants(graph, {i for n in graph.node if n.op_type == "DequantizeLinear" for i in n.input})
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}  # a pair's DQ output -> the float tensor it stands for
    made: list[onnx.TensorProto] = []
    dropped: set[int] = set()
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        src = node.input[0]
        if src in consts and node.input[1] in consts:
            made.append(numpy_helper.from_array(_weights(node, consts), node.output[0]))
            dropped.add(id(node))
        elif activations and src in producer and producer[src].op_type == "QuantizeLinear":
            if node.output[0] in outputs:
                raise DequantizeError(f"DequantizeLinear {node.name!r} writes a graph output")
            rename[node.output[0]] = producer[src].input[0]
            dropped.add(id(node))
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or not activations:
            continue
        if node.output[0] in outputs or any(id(r) not in dropped for r in readers.get(node.output[0], [])):
            raise DequantizeError(f"QuantizeLinear {node.name!r} feeds an operator other than DequantizeLinear")
        dropped.add(id(node))
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    g = twin.graph
    kept = [n for n, orig in zip(g.node, graph.node) if id(orig) not in dropped]
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
    read = {name for node in kept for name in node.input}
    inits = [t for t in g.initializer if t.name in read] + made
    del g.node[:]
    g.node.extend(kept)
    del g.initializer[:]
    g.initializer.extend(inits)
    return twin
