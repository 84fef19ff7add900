"""Op rules for shape tensors: nodes that compute with shape values of which some equal the batch.

Exporters compute Reshape targets and Expand shapes from ``Shape`` at run time; each rule here carries the
:class:`~edgert.rewrite.batch.values.Lin` elements through one op (``Mul`` of ``B`` by 3 is ``3*B``) or says
why it cannot. The rules are looked up by op type in :data:`SHAPE_RULES`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx

from edgert.rewrite.batch.base import AnalysisState, attr, norm
from edgert.rewrite.batch.values import Info, Lin, Unsupported, sym_or_none

__all__ = ["SHAPE_RULES", "ShapeRules"]

_ARITH: dict[str, Any] = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


class ShapeRules(AnalysisState):
    """The shape-tensor rules, one method per op (see :data:`SHAPE_RULES`)."""

    def sym_node(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        rule = SHAPE_RULES.get(node.op_type)
        if rule is None:
            raise Unsupported("computes with the batch size in a way edgert cannot follow")
        try:
            return rule(self, i, node, t)
        except Unsupported:
            raise
        except Exception as exc:  # numpy on object arrays of Lin: a shape computation we cannot follow
            raise Unsupported(f"computes a shape from the batch in a way edgert cannot follow ({exc})") from None

    def same(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        """Cast, Identity, CastLike: the values pass through."""
        return sym_or_none(self.sym_of(node, 0, t))

    def arith(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        a, b = self.sym_of(node, 0, t), self.sym_of(node, 1, t)
        fn: Any = _ARITH.get(node.op_type)
        if fn is None:  # Div: integer shape values divide as integers
            integer = np.issubdtype(self.vals[node.output[0]].dtype, np.integer)
            fn = np.floor_divide if integer else np.true_divide
        return sym_or_none(np.asarray(fn(a, b), dtype=object))

    def neg(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        return sym_or_none(np.asarray(-self.sym_of(node, 0, t), dtype=object))

    def equal(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        # torch exports test shape values against -1 or 0; B >= 1 decides those for every batch
        a, b = np.broadcast_arrays(self.sym_of(node, 0, t), self.sym_of(node, 1, t))
        out = self.vals[node.output[0]]
        for x, y, v in zip(a.reshape(-1), b.reshape(-1), out.reshape(-1)):
            d = x - y
            if d.dep and (d.c * d.a < 0 and (-d.c) % d.a == 0):  # a*B + c == 0 for some B >= 1
                raise Unsupported("compares a shape value with one the batch size can reach")
            if not d.dep and bool(d.c == 0) != bool(v):
                raise Unsupported("compares shape values inconsistently")
        return None  # the same at every batch: the probe's value

    def where(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        if t[0] is not None:
            raise Unsupported("selects with a batch-dependent condition")
        cond = self.vals[node.input[0]]
        return sym_or_none(np.asarray(np.where(cond, self.sym_of(node, 1, t), self.sym_of(node, 2, t)),
                                      dtype=object))

    def concat_sym(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        parts = [self.sym_of(node, p, t) for p in range(len(node.input))]
        return sym_or_none(np.concatenate(parts, axis=int(attr(node, "axis", 0))))

    def gather_sym(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        if len(t) > 1 and t[1] is not None:
            raise Unsupported("gathers with batch-dependent indices")
        idx = self.vals[node.input[1]]
        s = self.sym_of(node, 0, t)
        return sym_or_none(np.asarray(np.take(s, idx, axis=int(attr(node, "axis", 0))), dtype=object))

    def squeeze_sym(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        """Squeeze and Unsqueeze: the same values in the output's shape."""
        return sym_or_none(self.sym_of(node, 0, t).reshape(self.shape(node.output[0])))

    def reshape_sym(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        if len(t) > 1 and t[1] is not None:
            return self.reshape_to_sym(node, t)
        return sym_or_none(self.sym_of(node, 0, t).reshape(self.shape(node.output[0])))

    def reshape_to_sym(self, node: onnx.NodeProto, t: list[Info | None]) -> Info:
        """A data tensor reshaped to a shape computed from the batch: where does the batch land?"""
        x = t[0]
        if x is None or x.axis is None:
            raise Unsupported("reshapes a batch-independent tensor to a batch-dependent shape")
        k = x.axis
        in_shape = self.shape(node.input[0])
        out1 = self.shape(node.output[0])
        s = self.sym_of(node, 1, t).reshape(-1)
        allowzero = int(attr(node, "allowzero", 0))
        elems: list[Lin] = []
        for p, e in enumerate(s):
            if not e.dep and e.c == 0 and not allowzero:
                e = Lin(1, 0) if p == k else Lin(0, in_shape[p])
            elems.append(e)
        dep = [p for p, e in enumerate(elems) if e.dep]
        if len(dep) != 1 or elems[dep[0]].a != 1 or elems[dep[0]].c != 0:
            raise Unsupported(f"folds the batch into another dimension (shape {list(in_shape)} -> {elems})")
        j = dep[0]
        if int(np.prod(out1[:j])) != int(np.prod(in_shape[:k])):
            raise Unsupported(f"moves the batch across other dimensions (shape {list(in_shape)} -> {elems})")
        return Info(axis=j)

    def slice_sym(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        if any(x is not None for x in t[1:]):
            raise Unsupported("takes its slice bounds from the batch")
        s = self.sym_of(node, 0, t)
        starts, ends = self.vals[node.input[1]], self.vals[node.input[2]]
        axes_v = self.const(node, 3)
        steps = self.const(node, 4)
        s_axes = list(range(len(starts))) if axes_v is None else [norm(int(a), s.ndim) for a in axes_v]
        sl = [slice(None)] * s.ndim
        for j, ax in enumerate(s_axes):
            sl[ax] = slice(int(starts[j]), int(ends[j]), 1 if steps is None else int(steps[j]))
        return sym_or_none(s[tuple(sl)])

    def shape_of_sym(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        return None  # the shape of a shape tensor does not depend on the batch

    def constant_of_shape(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        s = self.sym_of(node, 0, t).reshape(-1)
        dep = [p for p, e in enumerate(s) if e.dep]
        if len(dep) != 1 or s[dep[0]].a != 1 or s[dep[0]].c != 0:
            raise Unsupported(f"makes a tensor of shape {list(s)}, which folds the batch")
        return Info(axis=dep[0])

    def expand_sym(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info | None:
        x = t[0]
        in_shape = self.shape(node.input[0])
        s = self.sym_of(node, 1, t).reshape(-1)
        out_rank = max(len(in_shape), len(s))
        dep = [p + out_rank - len(s) for p, e in enumerate(s) if e.dep]
        if any(s[p - (out_rank - len(s))].a != 1 or s[p - (out_rank - len(s))].c != 0 for p in dep):
            raise Unsupported("expands to a shape that folds the batch")
        if x is not None and x.axis is not None:
            kk = x.axis + out_rank - len(in_shape)
            if dep and dep != [kk]:
                raise Unsupported("expands to a batch on another axis than its input's")
            return Info(axis=kk)
        if len(dep) != 1:
            raise Unsupported("expands to a shape with more than one batch dimension")
        return Info(axis=dep[0])


_ShapeRule = Callable[[ShapeRules, int, onnx.NodeProto, "list[Info | None]"], "Info | None"]

#: op type -> the rule for a node of it whose inputs hold shape values that depend on the batch.
SHAPE_RULES: dict[str, _ShapeRule] = {
    **dict.fromkeys(("Cast", "Identity", "CastLike"), ShapeRules.same),
    **dict.fromkeys(("Add", "Sub", "Mul", "Div"), ShapeRules.arith),
    "Neg": ShapeRules.neg,
    "Equal": ShapeRules.equal,
    "Where": ShapeRules.where,
    "Concat": ShapeRules.concat_sym,
    "Gather": ShapeRules.gather_sym,
    **dict.fromkeys(("Unsqueeze", "Squeeze"), ShapeRules.squeeze_sym),
    "Reshape": ShapeRules.reshape_sym,
    "Slice": ShapeRules.slice_sym,
    "Shape": ShapeRules.shape_of_sym,
    "ConstantOfShape": ShapeRules.constant_of_shape,
    "Expand": ShapeRules.expand_sym,
}
