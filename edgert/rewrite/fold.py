"""Constant subgraphs of an ONNX graph folded into initializers, evaluated by onnx's reference evaluator.

TensorRT 8.5's Q/DQ graph optimizer does not finish on a pointwise node whose inputs are all constants:
yolov3-tiny's decoding computes ``Mul(Reciprocal(c1), c2)`` from two Constant nodes, and its INT8 Q/DQ builds
(edgert's placement and ModelOpt's alike) never reached a layer's timing
(docs/results/trt85-int8-qdq-loop-h100-2026-12-07.json). Folding such nodes before the build is what Polygraphy's
``surgeon sanitize --fold-constants`` does; that folds through ONNX Runtime (onnx-graphsurgeon), which a Jetson
running TensorRT need not have, while onnx's reference evaluator comes with onnx, which edgert needs anyway.

Quantize/DequantizeLinear are never folded (TensorRT reads a weight's Q/DQ pair as its INT8 scale), nor random
or control-flow nodes, nor a node whose result is a graph output or would be larger than ``max_bytes``.
"""

from __future__ import annotations

from collections.abc import Container

import onnx
from onnx import numpy_helper

from edgert.onnx_file import QDQ_OPS

__all__ = ["constant_nodes", "fold_constants"]

#: Never evaluated ahead of time: the Q/DQ the builder reads, random draws, and nodes holding subgraphs.
KEEP_OPS = QDQ_OPS | {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                      "Bernoulli", "If", "Loop", "Scan", "SequenceMap"}


def _foldable(node: onnx.NodeProto, constant: Container[str], outputs: Container[str]) -> bool:
    return (node.op_type != "Constant" and node.op_type not in KEEP_OPS and node.domain in ("", "ai.onnx")
            and any(node.input) and all(i in constant for i in node.input if i)
            and not any(o in outputs for o in node.output))


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """The names the subgraphs of ``node`` (an If's branches, a Loop's body) read, theirs and their own
    subgraphs': an outer value read only there must stay."""
    reads: set[str] = set()
    for attr in node.attribute:
        for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in graph.node:
                reads.update(i for i in inner.input if i)
                reads |= _subgraph_reads(inner)
    return reads


def constant_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes :func:`fold_constants` would evaluate: every input a constant, directly or once folded."""
    graph = model.graph
    constant = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    outputs = {o.name for o in graph.output}
    found = []
    for node in graph.node:
        if node.op_type == "Constant":
            constant.update(node.output)
        elif _foldable(node, constant, outputs):
            found.append(node)
            constant.update(o for o in node.output if o)
    return found


def _evaluate(node: onnx.NodeProto, values: dict[str, onnx.TensorProto],
              opsets: list[onnx.OperatorSetIdProto]) -> list[onnx.TensorProto]:
    from onnx.reference import ReferenceEvaluator

    inits = [values[i] for i in dict.fromkeys(i for i in node.input if i)]
    outs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = onnx.helper.make_graph([node], "fold", [], outs, initializer=inits)
    results = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=opsets)).run(None, {})
    return [numpy_helper.from_array(r, o) for r, o in zip(results, (o for o in node.output if o))]


def fold_constants(model: onnx.ModelProto, max_bytes: int = 4 << 20) -> int:
    """Replace ``model``'s constant nodes by initializers of their values, in place; how many were folded (its
    Constant nodes become initializers too once anything is). A node the reference evaluator cannot run stays as
    it is, and so do the nodes that read it."""
    graph = model.graph
    inputs = {i.name for i in graph.input}
    values = {t.name: t for t in graph.initializer if t.name not in inputs}
    outputs = {o.name for o in graph.output}
    opsets = list(model.opset_import)
    kept: list[onnx.NodeProto] = []
    folded = 0
    for node in graph.node:
        constant = node.op_type == "Constant"
        if constant or _foldable(node, values, outputs):
            try:
                tensors = _evaluate(node, values, opsets)
            except Exception:  # an op the reference evaluator lacks: TensorRT gets it as it was
                tensors = []
            if tensors and sum(len(t.raw_data) for t in tensors) <= max_bytes:
                values.update((t.name, t) for t in tensors)
                if not constant:
                    folded += 1
                    continue
        kept.append(node)
    if not folded:
        return 0
    nodes = [n for n in kept
             if n.op_type != "Constant" or not all(o in values for o in n.output) or n.output[0] in outputs]
    used = {i for n in nodes for i in n.input} | outputs | {i for n in nodes for i in _subgraph_reads(n)}
    produced = {o for n in nodes for o in n.output}
    existing = {t.name for t in graph.initializer}
    new = [values[name] for name in dict.fromkeys(o for n in graph.node for o in n.output)
           if name in values and name in used and name not in existing and name not in produced]
    del graph.node[:]
    graph.node.extend(nodes)
    # initializers only the folded nodes read go with them (unless a graph input names them)
    keep_inits = [t for t in graph.initializer if t.name in used or t.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(keep_inits + new)
    return folded
