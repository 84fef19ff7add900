"""The rewrite itself: a probe run at batch 1, the analysis, and the new graph with the edits written in."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from edgert.backends.onnxruntime import cpu_session
from edgert.errors import first_line
from edgert.rewrite.batch.model import (
    BATCH_DIM,
    ONNX_NP,
    BatchRewriteError,
    ModelLike,
    dims,
    has_dynamic_batch,
    load_model,
    real_inputs,
)
from edgert.rewrite.batch.rules import Analysis

__all__ = ["BatchRewrite", "rewrite_batch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchRewrite:
    """A rewritten model and what was changed in it (one line per change)."""

    model: onnx.ModelProto
    changes: tuple[str, ...] = ()
    already_dynamic: bool = False


def _probe(model: onnx.ModelProto, feed: dict[str, np.ndarray], label: str) -> dict[str, np.ndarray]:
    """Every tensor's value at batch 1: initializers, and every node output from one ONNX Runtime run."""
    vals: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    probe = copy.deepcopy(model)
    del probe.graph.output[:]
    del probe.graph.value_info[:]
    names: list[str] = []
    seen = set(vals) | {i.name for i in model.graph.input}
    for node in probe.graph.node:
        for out in node.output:
            if out and out not in seen:
                seen.add(out)
                names.append(out)
                probe.graph.output.append(onnx.ValueInfoProto(name=out))
    try:
        sess = cpu_session(probe, spin_wait=True, optimize=False, what="batch rewriting")
        values = sess.run(names, feed)
    except Exception as exc:
        raise BatchRewriteError(f"{label}: ONNX Runtime cannot run the model at batch 1 to trace its shapes: "
                                f"{first_line(exc)}") from None
    vals.update({n: np.asarray(v) for n, v in zip(names, values)})
    vals.update(feed)
    return vals



def _set_batch_dim(vi: onnx.ValueInfoProto) -> None:
    d = vi.type.tensor_type.shape.dim[0]
    d.Clear()
    d.dim_param = BATCH_DIM


def _prune(graph: onnx.GraphProto) -> None:
    """Drop nodes and initializers nothing uses any more (the constant subgraphs the rewrite replaced)."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return  # subgraphs may reference outer names; leave everything
    needed = {o.name for o in graph.output}
    keep: list[onnx.NodeProto] = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(n for n in node.input if n)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def rewrite_batch(model: ModelLike, label: str | None = None) -> BatchRewrite:
    """Rewrite a batch-1 model to take a symbolic batch (``batch``); raises :class:`BatchRewriteError`.

    ``label`` names the model in errors (default: the file name, or the graph name of a ModelProto).
    """
    proto, label = load_model(model, label)
    graph = proto.graph
    ins = real_inputs(graph)
    if not ins:
        raise BatchRewriteError(f"{label}: the model has no inputs")
    if has_dynamic_batch(proto):
        return BatchRewrite(copy.deepcopy(proto), (), already_dynamic=True)
    feed: dict[str, np.ndarray] = {}
    batched: list[str] = []
    for vi in ins:
        shape = dims(vi)
        if any(not isinstance(d, int) for d in shape):
            raise BatchRewriteError(f"{label}: input {vi.name} has dynamic dimensions {shape}; batch rewriting needs "
                                    "every other dimension fixed")
        if not shape or shape[0] != 1:
            raise BatchRewriteError(f"{label}: input {vi.name} has shape {shape}, not a batch of 1 on axis 0")
        dtype = ONNX_NP.get(vi.type.tensor_type.elem_type)
        if dtype is None:
            raise BatchRewriteError(f"{label}: input {vi.name} has a tensor type edgert cannot feed")
        feed[vi.name] = np.zeros([int(d) for d in shape], dtype=dtype)
        batched.append(vi.name)
    an = Analysis(proto, label)
    an.vals = _probe(proto, feed, label)
    an.run(batched)
    for out in graph.output:
        inf = an.info.get(out.name)
        if inf is None or inf.axis != 0:
            where = "does not depend on the input" if inf is None else f"carries the batch on axis {inf.axis}"
            raise BatchRewriteError(f"{label}: output {out.name} {where}, not on axis 0")

    new = copy.deepcopy(proto)
    g = new.graph
    nodes = list(g.node)
    del g.node[:]
    inits = list(an.extra_inits)
    for i, node in enumerate(nodes):
        g.node.extend(an.inserted.get(i, []))
        for (ni, idx), value in sorted(an.new_inputs.items()):
            if ni != i:
                continue
            if value.dtype == object:  # the name of an inserted tensor
                node.input[idx] = str(value.item())
                continue
            name = an.uid(node.input[idx] or f"{node.name}_in{idx}")
            inits.append(numpy_helper.from_array(value, name))
            node.input[idx] = name
        g.node.append(node)
    g.initializer.extend(inits)
    for vi in real_inputs(g):
        _set_batch_dim(vi)
    for vi in g.output:
        if len(vi.type.tensor_type.shape.dim):
            _set_batch_dim(vi)
    del g.value_info[:]
    _prune(g)
    try:
        new = onnx.shape_inference.infer_shapes(new)
    except Exception as exc:  # shapes are an annotation; ONNX Runtime and TensorRT infer their own
        log.info("%s: shape inference failed after the batch rewrite (%s); written without value_info", label, exc)
    try:
        onnx.checker.check_model(new)
    except Exception as exc:
        raise BatchRewriteError(f"{label}: the batch rewrite produced an invalid model ({exc}); this is an edgert "
                                "bug") from None
    return BatchRewrite(new, tuple(an.changes))
