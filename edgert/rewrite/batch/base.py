"""What every op rule of the batch rewrite works with: the analysis state and its helpers.

The state is the probe's values at batch 1 (``vals``), what is known of each tensor (``info``), and the
edits the rules ask for (``new_inputs``, ``inserted``, ``extra_inits``, ``changes``), which
:mod:`~edgert.rewrite.batch.apply` writes into the new graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgert.rewrite.batch.model import BatchRewriteError
from edgert.rewrite.batch.values import Info, Unsupported, lin_array

__all__ = ["AnalysisState", "attr", "norm", "subgraph_reads"]


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every tensor name the node's subgraphs (recursively) read."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            for n in g.node:
                names.update(x for x in n.input if x)
                names |= subgraph_reads(n)
    return names


def norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


class AnalysisState:
    """The analysis of one model: its values at batch 1, what depends on the batch, and the edits to make."""

    def __init__(self, model: onnx.ModelProto, label: str) -> None:
        self.model = model
        self.graph = model.graph
        self.label = label
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self.info: dict[str, Info] = {}
        self.vals: dict[str, np.ndarray] = {}
        self.new_inputs: dict[tuple[int, int], np.ndarray] = {}  # (node index, input index) -> constant
        self.inserted: dict[int, list[onnx.NodeProto]] = {}  # node index -> nodes to put before it
        self.changes: list[str] = []
        self.extra_inits: list[onnx.TensorProto] = []  # constants the inserted nodes read
        self._uid = 0

    def fail(self, node: onnx.NodeProto, why: str) -> BatchRewriteError:
        name = node.name or node.output[0]
        return BatchRewriteError(f"{self.label}: node {name} ({node.op_type}) {why}", node=name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.vals[name].shape)

    def const(self, node: onnx.NodeProto, idx: int) -> np.ndarray | None:
        """The value of input ``idx`` when it does not depend on the batch; None when absent."""
        if idx >= len(node.input) or not node.input[idx]:
            return None
        name = node.input[idx]
        if name in self.info:
            raise Unsupported(f"takes a batch-dependent value as input {idx} ({name})")
        return self.vals[name]

    def replace_input(self, i: int, node: onnx.NodeProto, idx: int, value: np.ndarray, what: str) -> None:
        self.new_inputs[(i, idx)] = value
        self.changes.append(f"{node.name or node.output[0]} ({node.op_type}): {what}")

    def uid(self, base: str) -> str:
        self._uid += 1
        return f"{base}__batch{self._uid}"

    def add_const(self, value: np.ndarray) -> str:
        name = self.uid("const")
        self.extra_inits.append(numpy_helper.from_array(value, name))
        return name

    def axes(self, node: onnx.NodeProto, input_idx: int) -> list[int] | None:
        """Axes from the attribute (older opsets) or the input (newer); None when absent."""
        a = attr(node, "axes", None)
        if a is not None:
            return [int(x) for x in a]
        v = self.const(node, input_idx)
        return None if v is None else [int(x) for x in v.reshape(-1)]

    def sym_of(self, node: onnx.NodeProto, idx: int, t: list[Info | None]) -> np.ndarray:
        """Input ``idx`` as shape values (:class:`~edgert.rewrite.batch.values.Lin` elements)."""
        x = t[idx] if idx < len(t) else None
        if x is not None:
            if x.sym is None:
                raise Unsupported("mixes batched data with shape values")
            return x.sym
        return lin_array(self.vals[node.input[idx]])
