"""Make a model's batch dimension dynamic: a graph exported at batch 1 becomes one that takes any batch.

Setting the input's first dim to ``batch`` is not enough: exporters bake the batch into constants (a
Reshape to ``[1, 66, -1]``, a Slice that ends at 1 on axis 0, a shape computed by a constant subgraph).
The rewrite follows the batch axis through the graph instead of guessing:

1. A probe run at batch 1 (ONNX Runtime, every intermediate tensor an output) gives every tensor's shape
   and the value of every constant or shape tensor, folded subgraphs included.
2. The batch axis is tracked from the inputs node by node: where it goes (a Transpose moves it, a
   Squeeze shifts it), and, for shape tensors computed with ``Shape``, which elements equal the batch
   (values are kept as ``a*B + c``). A tensor nothing batched flows into is the same at every batch.
3. Constants that pin the batch are rewritten where ONNX semantics allow it: a Reshape target gets ``0``
   (copy the input's dim) at the batch position when the batch stays at the same index, else ``-1``
   with the former ``-1`` resolved to its size; a Slice that covers the whole batch axis at batch 1
   ends at INT64_MAX; a batch-independent Concat input is expanded to the batch. Anything that mixes
   the batch with another dimension (a Reshape that folds it, a Gather along it, a reduction over it,
   a Squeeze without axes) is refused with one line naming the node and why.

:func:`check_batch_rewrite` then runs both models on ONNX Runtime CPU and checks that row ``i`` of the
rewritten model's output at batch B equals the original's output for input ``i``, so a wrong rewrite is
caught rather than trusted. :func:`batched_model_path` caches the checked result by the source's sha256.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgert._lazy import lazy_import
from edgert.atomic_file import replace_file, sha256_file
from edgert.errors import ModelError, first_line

__all__ = [
    "BATCH_DIM",
    "BatchRewrite",
    "BatchRewriteError",
    "batch_cache_dir",
    "batched_model_path",
    "check_batch_rewrite",
    "has_dynamic_batch",
    "make_batch_dynamic",
    "rewrite_batch",
]

log = logging.getLogger(__name__)

#: The name the rewritten inputs and outputs give their first dimension.
BATCH_DIM = "batch"

_INT64_MAX = int(np.iinfo(np.int64).max)

ModelLike = Union[onnx.ModelProto, str, Path]


class BatchRewriteError(ModelError):
    """The batch dimension of this model cannot be made dynamic (or the rewrite changed its outputs).

    ``node`` is the node's name where one is at fault; the message is one line.
    """

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class BatchRewrite:
    """A rewritten model and what was changed in it (one line per change)."""

    model: onnx.ModelProto
    changes: tuple[str, ...] = ()
    already_dynamic: bool = False


# -- values that depend on the batch ----------------------------------------------------------------------
class _Lin:
    """``a * B + c``: one element of a shape tensor whose value may depend on the batch size B."""

    __slots__ = ("a", "c")

    def __init__(self, a: Any, c: Any) -> None:
        self.a = a
        self.c = c

    @staticmethod
    def of(x: Any) -> _Lin:
        return x if isinstance(x, _Lin) else _Lin(0, x.item() if isinstance(x, np.generic) else x)

    @property
    def dep(self) -> bool:
        return bool(self.a != 0)

    def at1(self) -> Any:
        return self.a + self.c

    def __add__(self, o: Any) -> _Lin:
        o = _Lin.of(o)
        return _Lin(self.a + o.a, self.c + o.c)

    __radd__ = __add__

    def __neg__(self) -> _Lin:
        return _Lin(-self.a, -self.c)

    def __sub__(self, o: Any) -> _Lin:
        return self + (-_Lin.of(o))

    def __rsub__(self, o: Any) -> _Lin:
        return _Lin.of(o) - self

    def __mul__(self, o: Any) -> _Lin:
        o = _Lin.of(o)
        if self.dep and o.dep:
            raise _Unsupported("multiplies the batch size by itself")
        return _Lin(self.a * o.c + o.a * self.c, self.c * o.c)

    __rmul__ = __mul__

    def _div(self, o: Any, floor: bool) -> _Lin:
        o = _Lin.of(o)
        if o.dep:
            raise _Unsupported("divides by the batch size")
        d = o.c
        if floor:
            if self.a % d or self.c % d:
                raise _Unsupported("divides the batch size unevenly")
            return _Lin(self.a // d, self.c // d)
        return _Lin(self.a / d, self.c / d)

    def __floordiv__(self, o: Any) -> _Lin:
        return self._div(o, True)

    def __truediv__(self, o: Any) -> _Lin:
        return self._div(o, False)

    def __repr__(self) -> str:
        if not self.dep:
            return repr(self.c)
        b = "B" if self.a == 1 else f"{self.a}*B"
        return b if self.c == 0 else f"{b}+{self.c}"


class _Unsupported(Exception):
    """Raised inside the analysis; becomes a BatchRewriteError naming the node."""


@dataclass
class _Info:
    """How a tensor depends on the batch: ``axis`` where it carries it, ``sym`` when its values do."""

    axis: int | None = None
    sym: np.ndarray | None = None  # object array of _Lin, same shape as the tensor


def _lin_array(value: np.ndarray) -> np.ndarray:
    out = np.empty(value.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(value.reshape(-1).tolist()):
        flat[i] = _Lin(0, v)
    return out


def _sym_or_none(sym: np.ndarray) -> _Info | None:
    """Shape values with no batch-dependent element are plain constants again."""
    if any(e.dep for e in sym.reshape(-1)):
        return _Info(sym=sym)
    return None


# -- the analysis ---------------------------------------------------------------------------------------
_UNARY = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Reciprocal", "Floor", "Ceil",
    "Round", "Erf", "Sin", "Cos", "Softplus", "Softsign", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish",
    "Mish", "Gelu", "ThresholdedRelu", "Not", "Sign", "IsNaN", "IsInf", "Identity", "Cast", "CastLike", "Clip",
    "Dropout", "QuantizeLinear", "DequantizeLinear", "Shrink", "BitwiseNot",
})
_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "PRelu", "Mod", "BitShift", "BitwiseAnd",
    "BitwiseOr", "BitwiseXor",
})
# Ops whose batch is axis 0 of input 0 and stays axis 0 (N of NCHW).
_NCHW = frozenset({
    "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "GlobalLpPool", "LpPool", "BatchNormalization", "InstanceNormalization", "LRN",
    "DepthToSpace", "SpaceToDepth", "GroupNormalization", "MaxUnpool",
})
_AXIS_OPS = {"Softmax", "LogSoftmax", "Hardmax", "LpNormalization"}
_REDUCE = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
})


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every tensor name the node's subgraphs (recursively) read."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            for n in g.node:
                names.update(x for x in n.input if x)
                names |= _subgraph_reads(n)
    return names


def _norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


class _Analysis:
    def __init__(self, model: onnx.ModelProto, label: str) -> None:
        self.model = model
        self.graph = model.graph
        self.label = label
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self.info: dict[str, _Info] = {}
        self.vals: dict[str, np.ndarray] = {}
        self.new_inputs: dict[tuple[int, int], np.ndarray] = {}  # (node index, input index) -> constant
        self.inserted: dict[int, list[onnx.NodeProto]] = {}  # node index -> nodes to put before it
        self.changes: list[str] = []
        self.extra_inits: list[onnx.TensorProto] = []  # constants the inserted nodes read
        self._uid = 0

    # -- helpers -------------------------------------------------------------------------------------
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
            raise _Unsupported(f"takes a batch-dependent value as input {idx} ({name})")
        return self.vals[name]

    def replace_input(self, i: int, node: onnx.NodeProto, idx: int, value: np.ndarray, what: str) -> None:
        self.new_inputs[(i, idx)] = value
        self.changes.append(f"{node.name or node.output[0]} ({node.op_type}): {what}")

    def uid(self, base: str) -> str:
        self._uid += 1
        return f"{base}__batch{self._uid}"

    # -- driver -------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[str]) -> None:
        for name in inputs:
            self.info[name] = _Info(axis=0)
        for i, node in enumerate(self.graph.node):
            touched = [self.info.get(n) if n else None for n in node.input]
            if not any(t is not None for t in touched):
                # A subgraph (If, Loop) may read batched tensors of this scope without naming them as inputs.
                if any(n in self.info for n in _subgraph_reads(node)):
                    raise self.fail(node, "has a subgraph that reads the batch; batch rewriting does not enter "
                                          "subgraphs")
                continue  # the same at every batch: its value is the probe's
            try:
                outs = self.node(i, node, touched)
            except _Unsupported as exc:
                raise self.fail(node, str(exc)) from None
            for name, inf in zip(node.output, outs):
                if name and inf is not None:
                    self.info[name] = inf

    def node(self, i: int, node: onnx.NodeProto, t: list[_Info | None]) -> list[_Info | None]:
        op = node.op_type
        t0 = t[0] if t else None
        n_out = len(node.output)
        if node.domain not in ("", "ai.onnx"):
            raise _Unsupported(f"is a {node.domain} op, not known to keep the batch dimension")
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise _Unsupported("has a subgraph; batch rewriting does not enter subgraphs")

        # shape tensors: values that depend on the batch
        if any(x is not None and x.sym is not None for x in t):
            return [self.sym_node(i, node, t)] + [None] * (n_out - 1)

        if op in _UNARY:
            if any(x is not None for x in t[1:]):
                raise _Unsupported("takes the batch in a parameter input")
            if op in ("QuantizeLinear", "DequantizeLinear"):
                scale = self.const(node, 1)
                if scale is not None and scale.ndim == 1 and scale.size > 1:
                    axis = _norm(int(_attr(node, "axis", 1)), len(self.shape(node.input[0])))
                    if t0 is not None and axis == t0.axis:
                        raise _Unsupported("quantizes per channel along the batch axis")
            return [_Info(axis=t0.axis) if t0 is not None else None] * n_out
        if op in _BROADCAST:
            return [self.broadcast(node, t)]
        if op in _NCHW:
            if t0 is None or t0.axis != 0 or any(x is not None for x in t[1:]):
                raise _Unsupported("expects the batch on axis 0 of its data input only")
            if op == "MaxPool":  # Indices are per image too
                return [_Info(axis=0)] * n_out
            return [_Info(axis=0)] + [None] * (n_out - 1)  # BatchNormalization's running stats are not
        if t0 is None:
            raise _Unsupported("takes the batch in a parameter input")
        k = t0.axis
        assert k is not None
        in_shape = self.shape(node.input[0])
        rank = len(in_shape)
        if op in _AXIS_OPS:
            default = -1 if (self.opset >= 13 or op == "LpNormalization") else 1
            axis = _norm(int(_attr(node, "axis", default)), rank)
            if axis == k or (self.opset < 13 and op != "LpNormalization" and axis <= k):
                raise _Unsupported(f"normalizes along the batch axis (axis {axis})")
            return [_Info(axis=k)]
        if op == "LayerNormalization":
            axis = _norm(int(_attr(node, "axis", -1)), rank)
            if axis <= k:
                raise _Unsupported(f"normalizes over the batch axis (axis {axis})")
            return [_Info(axis=k)] * n_out  # Mean and InvStdDev keep the leading dims
        if op == "Transpose":
            perm = list(_attr(node, "perm", list(range(rank))[::-1]))
            return [_Info(axis=perm.index(k))]
        if op == "Concat":
            return [self.concat(i, node, t)]
        if op == "Split":
            axis = _norm(int(_attr(node, "axis", 0)), rank)
            if axis == k:
                raise _Unsupported("splits along the batch axis")
            if len(t) > 1 and t[1] is not None:
                raise _Unsupported("takes its split sizes from the batch")
            return [_Info(axis=k)] * n_out
        if op == "Slice":
            return [self.slice(i, node, k, rank)]
        if op == "Gather":
            axis = _norm(int(_attr(node, "axis", 0)), rank)
            idx = self.const(node, 1)
            if axis == k:
                raise _Unsupported("gathers along the batch axis")
            assert idx is not None
            return [_Info(axis=k + idx.ndim - 1 if axis < k else k)]
        if op == "Unsqueeze":
            axes = self.axes(node, 1)
            assert axes is not None
            out_rank = rank + len(axes)
            axes = sorted(_norm(a, out_rank) for a in axes)
            free = [p for p in range(out_rank) if p not in axes]
            return [_Info(axis=free[k])]
        if op == "Squeeze":
            return [self.squeeze(i, node, k, in_shape)]
        if op == "Reshape":
            return [self.reshape(i, node, k, in_shape)]
        if op == "Flatten":
            axis = _norm(int(_attr(node, "axis", 1)), rank)
            if k < axis and int(np.prod(in_shape[:axis])) == 1:
                return [_Info(axis=0)]
            if k >= axis and int(np.prod(in_shape[axis:])) == 1:
                return [_Info(axis=1)]
            raise _Unsupported(f"folds the batch into another dimension (flatten at axis {axis} of shape "
                               f"{list(in_shape)})")
        if op == "Expand":
            shape = self.const(node, 1)
            assert shape is not None
            out_rank = max(rank, shape.size)
            kk = k + out_rank - rank
            p = kk - (out_rank - shape.size)
            if p >= 0 and int(shape[p]) != 1:
                raise _Unsupported(f"expands the batch axis to {int(shape[p])}")
            return [_Info(axis=kk)]
        if op == "Tile":
            reps = self.const(node, 1)
            assert reps is not None
            if int(reps[k]) != 1:
                raise _Unsupported(f"tiles along the batch axis ({int(reps[k])} repeats)")
            return [_Info(axis=k)]
        if op == "Pad":
            self.check_pad(node, k, rank)
            return [_Info(axis=k)]
        if op in ("Resize", "Upsample"):
            if k != 0:
                raise _Unsupported("expects the batch on axis 0")
            self.check_resize(i, node)
            return [_Info(axis=0)]
        if op == "MatMul":
            return [self.matmul(node, t)]
        if op == "Gemm":
            if any(x is not None for x in t[1:]):
                raise _Unsupported("takes the batch in its B or C input")
            if k != (1 if _attr(node, "transA", 0) else 0):
                raise _Unsupported("contracts over the batch axis")
            return [_Info(axis=0)]
        if op in _REDUCE or op in ("ArgMax", "ArgMin"):
            return [self.reduce(node, k, rank)]
        if op == "TopK":
            axis = _norm(int(_attr(node, "axis", -1)), rank)
            self.const(node, 1)
            if axis == k:
                raise _Unsupported("takes the top k along the batch axis")
            return [_Info(axis=k)] * n_out
        if op == "CumSum":
            cum_axis = self.const(node, 1)
            assert cum_axis is not None
            if _norm(int(cum_axis), rank) == k:
                raise _Unsupported("sums along the batch axis")
            return [_Info(axis=k)]
        if op == "Shape":
            start = _norm(int(_attr(node, "start", 0)), rank)
            end = _attr(node, "end", None)
            end = rank if end is None else min(_norm(int(end), rank), rank)
            sym = np.empty(rank, dtype=object)
            for p, d in enumerate(in_shape):
                sym[p] = _Lin(1, 0) if p == k else _Lin(0, d)
            return [_sym_or_none(sym[start:end])]
        if op == "Size":
            other = int(np.prod([d for p, d in enumerate(in_shape) if p != k]))
            return [_Info(sym=np.array(_Lin(other, 0), dtype=object))]
        raise _Unsupported("is not known to keep the batch dimension")

    # -- op rules -----------------------------------------------------------------------------------
    def axes(self, node: onnx.NodeProto, input_idx: int) -> list[int] | None:
        """Axes from the attribute (older opsets) or the input (newer); None when absent."""
        a = _attr(node, "axes", None)
        if a is not None:
            return [int(x) for x in a]
        v = self.const(node, input_idx)
        return None if v is None else [int(x) for x in v.reshape(-1)]

    def broadcast(self, node: onnx.NodeProto, t: list[_Info | None]) -> _Info:
        shapes = [self.shape(n) if n else () for n in node.input]
        out_rank = max(len(s) for s in shapes)
        pos = {x.axis + out_rank - len(s) for x, s in zip(t, shapes) if x is not None and x.axis is not None}
        if len(pos) != 1:
            raise _Unsupported("combines inputs whose batch axes do not line up")
        kk = pos.pop()
        for x, s in zip(t, shapes):
            if x is None:
                p = kk - (out_rank - len(s))
                if p >= 0 and s[p] != 1:
                    raise _Unsupported(f"broadcasts the batch against a dimension of {s[p]}")
        return _Info(axis=kk)

    def concat(self, i: int, node: onnx.NodeProto, t: list[_Info | None]) -> _Info:
        rank = len(self.shape(node.input[0]))
        axis = _norm(int(_attr(node, "axis", 0)), rank)
        ks = {x.axis for x in t if x is not None}
        if len(ks) != 1:
            raise _Unsupported("concatenates inputs whose batch axes differ")
        k = ks.pop()
        assert k is not None
        if axis == k:
            raise _Unsupported("concatenates along the batch axis")
        # A batch-independent input (a grid, an anchor table) has 1 there: expand it to the batch.
        ref = next(n for n, x in zip(node.input, t) if x is not None)
        for idx, (name, x) in enumerate(zip(node.input, t)):
            if x is None:
                self.expand_to_batch(i, node, idx, name, ref, k, rank)
        return _Info(axis=k)

    def expand_to_batch(self, i: int, node: onnx.NodeProto, idx: int, name: str, ref: str, k: int,
                        rank: int) -> None:
        shape_out, b, ones, target, out = (self.uid(name) for _ in range(5))
        nodes = [
            helper.make_node("Shape", [ref], [shape_out], name=self.uid("Shape")),
            helper.make_node("Slice", [shape_out, self.add_const(np.array([k], np.int64)),
                                       self.add_const(np.array([k + 1], np.int64))], [b], name=self.uid("Slice")),
        ]
        parts: list[str] = []
        if k:
            parts.append(self.add_const(np.ones(k, np.int64)))
        parts.append(b)
        if rank - k - 1:
            parts.append(self.add_const(np.ones(rank - k - 1, np.int64)))
        del ones
        nodes.append(helper.make_node("Concat", parts, [target], axis=0, name=self.uid("Concat")))
        nodes.append(helper.make_node("Expand", [name, target], [out], name=self.uid("Expand")))
        self.inserted.setdefault(i, []).extend(nodes)
        self.new_inputs[(i, idx)] = np.array(out, dtype=object)  # a tensor name, not a value
        self.changes.append(f"{node.name or node.output[0]} (Concat): input {name} expanded to the batch")

    def add_const(self, value: np.ndarray) -> str:
        name = self.uid("const")
        self.extra_inits.append(numpy_helper.from_array(value, name))
        return name

    def slice(self, i: int, node: onnx.NodeProto, k: int, rank: int) -> _Info:
        if any(self.info.get(n) is not None for n in node.input[1:] if n):
            raise _Unsupported("takes its slice bounds from the batch")
        if self.opset < 10:
            axes = _attr(node, "axes", None)
            if axes is None or k in [_norm(int(a), rank) for a in axes]:
                raise _Unsupported("slices the batch axis (opset < 10 attribute form)")
            return _Info(axis=k)
        starts = self.const(node, 1)
        ends = self.const(node, 2)
        assert starts is not None and ends is not None
        axes_v = self.const(node, 3)
        steps = self.const(node, 4)
        axes = list(range(len(starts))) if axes_v is None else [_norm(int(a), rank) for a in axes_v]
        if k not in axes:
            return _Info(axis=k)
        j = axes.index(k)
        step = 1 if steps is None else int(steps[j])
        start, end = int(starts[j]), int(ends[j])
        if step != 1 or (start not in (0,) and start > -(1 << 62)) or end < 1:
            raise _Unsupported(f"slices the batch axis ({start}:{end}:{step}), so rows would be dropped")
        if end < _INT64_MAX:
            new = np.array(ends, copy=True)
            new[j] = _INT64_MAX
            self.replace_input(i, node, 2, new.astype(ends.dtype), f"slice end on the batch axis {end} -> INT64_MAX")
            if start != 0:
                new_s = np.array(starts, copy=True)
                new_s[j] = 0
                self.new_inputs[(i, 1)] = new_s
        return _Info(axis=k)

    def squeeze(self, i: int, node: onnx.NodeProto, k: int, in_shape: tuple[int, ...]) -> _Info:
        rank = len(in_shape)
        axes = self.axes(node, 1)
        if axes is None:
            # Every 1-sized dim goes, the batch among them at batch 1: what follows expects no batch axis.
            raise _Unsupported("squeezes every dimension of size 1, the batch among them")
        axes = [_norm(a, rank) for a in axes]
        if k in axes:
            raise _Unsupported("squeezes out the batch axis")
        return _Info(axis=k - sum(1 for a in axes if a < k))

    def reshape(self, i: int, node: onnx.NodeProto, k: int, in_shape: tuple[int, ...]) -> _Info:
        out_shape = self.shape(node.output[0])
        target = self.const(node, 1)
        assert target is not None
        allowzero = int(_attr(node, "allowzero", 0))
        pre = int(np.prod(in_shape[:k]))
        cands = [j for j, d in enumerate(out_shape) if d == 1 and int(np.prod(out_shape[:j])) == pre]
        if not cands:
            raise _Unsupported(f"folds the batch into another dimension (shape {list(in_shape)} -> "
                               f"{list(out_shape)})")
        j = k if k in cands else cands[0]
        new = [int(v) for v in target.reshape(-1)]
        if new[j] == 0 and not allowzero and j == k:
            return _Info(axis=j)  # already copies the input's batch
        # Resolve every other wildcard to its batch-1 size, then let the batch be the one wildcard.
        for p, v in enumerate(new):
            if p != j and v == -1:
                new[p] = out_shape[p]
        if j == k and not allowzero:
            new[j] = 0
        else:
            if allowzero and 0 in new:
                new = [out_shape[p] if (v == 0 and p != j) else v for p, v in enumerate(new)]
            new[j] = -1
        self.replace_input(i, node, 1, np.array(new, np.int64),
                           f"shape {[int(v) for v in target.reshape(-1)]} -> {new}")
        return _Info(axis=j)

    def check_pad(self, node: onnx.NodeProto, k: int, rank: int) -> None:
        pads = _attr(node, "pads", None)
        if pads is None:
            v = self.const(node, 1)
            pads = [] if v is None else [int(x) for x in v]
        axes_v = self.const(node, 3)
        axes = list(range(rank)) if axes_v is None else [_norm(int(a), rank) for a in axes_v]
        if k in axes and pads:
            j = axes.index(k)
            if int(pads[j]) or int(pads[j + len(axes)]):
                raise _Unsupported("pads the batch axis")

    def check_resize(self, i: int, node: onnx.NodeProto) -> None:
        if node.op_type == "Upsample" or self.opset < 11:
            scales = _attr(node, "scales", None)
            if scales is None:
                v = self.const(node, 1)
                scales = None if v is None else v.tolist()
            if scales is not None and float(scales[0]) != 1.0:
                raise _Unsupported("scales the batch axis")
            return
        scales_v = self.const(node, 2)
        sizes = self.const(node, 3)
        axes = _attr(node, "axes", None)
        if axes is not None and 0 not in [int(a) for a in axes]:
            return
        if scales_v is not None and scales_v.size and float(scales_v.reshape(-1)[0]) != 1.0:
            raise _Unsupported("scales the batch axis")
        if sizes is not None and sizes.size:
            self.resize_sizes_to_scales(i, node, sizes, axes)

    def resize_sizes_to_scales(self, i: int, node: onnx.NodeProto, sizes: np.ndarray, axes: Any) -> None:
        """``sizes`` pins the batch at 1; the same output from ``scales`` (batch 1.0) where floor(in x scale)
        gives back every size exactly, so ONNX Runtime and TensorRT compute the same coordinates."""
        if _attr(node, "keep_aspect_ratio_policy", b"stretch") not in (b"stretch", "stretch"):
            raise _Unsupported("sets a fixed output size with a kept aspect ratio on the batch axis")
        in_shape = self.shape(node.input[0])
        dims = list(range(len(in_shape))) if axes is None else [_norm(int(a), len(in_shape)) for a in axes]
        scales = np.array([1.0 if d == 0 else float(sz) / in_shape[d] for d, sz in zip(dims, sizes.tolist())],
                          np.float32)
        for d, sz, sc in zip(dims, sizes.tolist(), scales.tolist()):
            if d != 0 and int(np.floor(np.float32(in_shape[d]) * np.float32(sc))) != int(sz):
                raise _Unsupported(f"sets a fixed output size (Resize sizes {sizes.tolist()}) that no scale "
                                   "reproduces exactly")
        while len(node.input) < 3:
            node.input.append("")
        self.replace_input(i, node, 2, scales, f"sizes {sizes.tolist()} -> scales {scales.tolist()}")
        self.new_inputs[(i, 3)] = np.array("", dtype=object)  # sizes dropped: scales alone

    def matmul(self, node: onnx.NodeProto, t: list[_Info | None]) -> _Info:
        a_shape, b_shape = self.shape(node.input[0]), self.shape(node.input[1])
        ra, rb = len(a_shape), len(b_shape)
        out_rank = max(ra, rb, 2)
        pos = set()
        if t[0] is not None:
            ka = t[0].axis
            assert ka is not None
            if ka == ra - 1:
                raise _Unsupported("contracts over the batch axis")
            pos.add(out_rank - 2 if ka == ra - 2 else ka + out_rank - ra)
        if len(t) > 1 and t[1] is not None:
            kb = t[1].axis
            assert kb is not None
            if kb >= rb - 2:
                raise _Unsupported("takes the batch in its right-hand matrix")
            pos.add(kb + out_rank - rb)
        if len(pos) != 1:
            raise _Unsupported("multiplies inputs whose batch axes do not line up")
        kk = pos.pop()
        if t[1] is None and kk < out_rank - 2:
            p = kk - (out_rank - rb)
            if p >= 0 and b_shape[p] != 1:
                raise _Unsupported(f"broadcasts the batch against a dimension of {b_shape[p]}")
        return _Info(axis=kk)

    def reduce(self, node: onnx.NodeProto, k: int, rank: int) -> _Info:
        keep = int(_attr(node, "keepdims", 1))
        if node.op_type in ("ArgMax", "ArgMin"):
            axes: list[int] | None = [int(_attr(node, "axis", 0))]
        else:
            axes = self.axes(node, 1)
        if not axes:
            if int(_attr(node, "noop_with_empty_axes", 0)):
                return _Info(axis=k)
            raise _Unsupported("reduces over every axis, the batch among them")
        axes = [_norm(a, rank) for a in axes]
        if k in axes:
            raise _Unsupported("reduces over the batch axis")
        return _Info(axis=k if keep else k - sum(1 for a in axes if a < k))

    # -- shape tensors ------------------------------------------------------------------------------
    def sym_of(self, node: onnx.NodeProto, idx: int, t: list[_Info | None]) -> np.ndarray:
        x = t[idx] if idx < len(t) else None
        if x is not None:
            if x.sym is None:
                raise _Unsupported("mixes batched data with shape values")
            return x.sym
        return _lin_array(self.vals[node.input[idx]])

    def sym_node(self, i: int, node: onnx.NodeProto, t: list[_Info | None]) -> _Info | None:
        op = node.op_type
        try:
            if op in ("Cast", "Identity", "CastLike"):
                return _sym_or_none(self.sym_of(node, 0, t))
            if op in ("Add", "Sub", "Mul", "Div"):
                a, b = self.sym_of(node, 0, t), self.sym_of(node, 1, t)
                integer = np.issubdtype(self.vals[node.output[0]].dtype, np.integer)
                fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
                      "Div": np.floor_divide if integer else np.true_divide}[op]
                return _sym_or_none(np.asarray(fn(a, b), dtype=object))
            if op == "Neg":
                return _sym_or_none(np.asarray(-self.sym_of(node, 0, t), dtype=object))
            if op == "Equal":
                # torch exports test shape values against -1 or 0; B >= 1 decides those for every batch
                a, b = np.broadcast_arrays(self.sym_of(node, 0, t), self.sym_of(node, 1, t))
                out = self.vals[node.output[0]]
                for x, y, v in zip(a.reshape(-1), b.reshape(-1), out.reshape(-1)):
                    d = x - y
                    if d.dep and (d.c * d.a < 0 and (-d.c) % d.a == 0):  # a*B + c == 0 for some B >= 1
                        raise _Unsupported("compares a shape value with one the batch size can reach")
                    if not d.dep and bool(d.c == 0) != bool(v):
                        raise _Unsupported("compares shape values inconsistently")
                return None  # the same at every batch: the probe's value
            if op == "Where":
                if t[0] is not None:
                    raise _Unsupported("selects with a batch-dependent condition")
                cond = self.vals[node.input[0]]
                return _sym_or_none(np.asarray(np.where(cond, self.sym_of(node, 1, t), self.sym_of(node, 2, t)),
                                               dtype=object))
            if op == "Concat":
                parts = [self.sym_of(node, p, t) for p in range(len(node.input))]
                return _sym_or_none(np.concatenate(parts, axis=int(_attr(node, "axis", 0))))
            if op == "Gather":
                if len(t) > 1 and t[1] is not None:
                    raise _Unsupported("gathers with batch-dependent indices")
                idx = self.vals[node.input[1]]
                s = self.sym_of(node, 0, t)
                return _sym_or_none(np.asarray(np.take(s, idx, axis=int(_attr(node, "axis", 0))), dtype=object))
            if op in ("Unsqueeze", "Squeeze"):
                s = self.sym_of(node, 0, t)
                return _sym_or_none(s.reshape(self.shape(node.output[0])))
            if op == "Reshape":
                if len(t) > 1 and t[1] is not None:
                    return self.reshape_sym(i, node, t)
                return _sym_or_none(self.sym_of(node, 0, t).reshape(self.shape(node.output[0])))
            if op == "Slice":
                if any(x is not None for x in t[1:]):
                    raise _Unsupported("takes its slice bounds from the batch")
                s = self.sym_of(node, 0, t)
                starts, ends = self.vals[node.input[1]], self.vals[node.input[2]]
                axes_v = self.const(node, 3)
                steps = self.const(node, 4)
                s_axes = list(range(len(starts))) if axes_v is None else [_norm(int(a), s.ndim) for a in axes_v]
                sl = [slice(None)] * s.ndim
                for j, ax in enumerate(s_axes):
                    sl[ax] = slice(int(starts[j]), int(ends[j]), 1 if steps is None else int(steps[j]))
                return _sym_or_none(s[tuple(sl)])
            if op == "Shape":
                return None  # the shape of a shape tensor does not depend on the batch
            if op == "ConstantOfShape":
                s = self.sym_of(node, 0, t).reshape(-1)
                dep = [p for p, e in enumerate(s) if e.dep]
                if len(dep) != 1 or s[dep[0]].a != 1 or s[dep[0]].c != 0:
                    raise _Unsupported(f"makes a tensor of shape {list(s)}, which folds the batch")
                return _Info(axis=dep[0])
            if op == "Expand":
                return self.expand_sym(node, t)
        except _Unsupported:
            raise
        except Exception as exc:  # numpy on object arrays of _Lin: a shape computation we cannot follow
            raise _Unsupported(f"computes a shape from the batch in a way edgert cannot follow ({exc})") from None
        raise _Unsupported("computes with the batch size in a way edgert cannot follow")

    def reshape_sym(self, i: int, node: onnx.NodeProto, t: list[_Info | None]) -> _Info:
        x = t[0]
        if x is None or x.axis is None:
            raise _Unsupported("reshapes a batch-independent tensor to a batch-dependent shape")
        k = x.axis
        in_shape = self.shape(node.input[0])
        out1 = self.shape(node.output[0])
        s = self.sym_of(node, 1, t).reshape(-1)
        allowzero = int(_attr(node, "allowzero", 0))
        elems: list[_Lin] = []
        for p, e in enumerate(s):
            if not e.dep and e.c == 0 and not allowzero:
                e = _Lin(1, 0) if p == k else _Lin(0, in_shape[p])
            elems.append(e)
        dep = [p for p, e in enumerate(elems) if e.dep]
        if len(dep) != 1 or elems[dep[0]].a != 1 or elems[dep[0]].c != 0:
            raise _Unsupported(f"folds the batch into another dimension (shape {list(in_shape)} -> {elems})")
        j = dep[0]
        if int(np.prod(out1[:j])) != int(np.prod(in_shape[:k])):
            raise _Unsupported(f"moves the batch across other dimensions (shape {list(in_shape)} -> {elems})")
        return _Info(axis=j)

    def expand_sym(self, node: onnx.NodeProto, t: list[_Info | None]) -> _Info:
        x = t[0]
        in_shape = self.shape(node.input[0])
        s = self.sym_of(node, 1, t).reshape(-1)
        out_rank = max(len(in_shape), len(s))
        dep = [p + out_rank - len(s) for p, e in enumerate(s) if e.dep]
        if any(s[p - (out_rank - len(s))].a != 1 or s[p - (out_rank - len(s))].c != 0 for p in dep):
            raise _Unsupported("expands to a shape that folds the batch")
        if x is not None and x.axis is not None:
            kk = x.axis + out_rank - len(in_shape)
            if dep and dep != [kk]:
                raise _Unsupported("expands to a batch on another axis than its input's")
            return _Info(axis=kk)
        if len(dep) != 1:
            raise _Unsupported("expands to a shape with more than one batch dimension")
        return _Info(axis=dep[0])


# -- probe run ------------------------------------------------------------------------------------------
def _probe(model: onnx.ModelProto, feed: dict[str, np.ndarray], label: str) -> dict[str, np.ndarray]:
    """Every tensor's value at batch 1: initializers, and every node output from one ONNX Runtime run."""
    ort = lazy_import("onnxruntime", "batch rewriting")
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
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])
        values = sess.run(names, feed)
    except Exception as exc:
        first = first_line(exc)
        raise BatchRewriteError(f"{label}: ONNX Runtime cannot run the model at batch 1 to trace its shapes: "
                                f"{first}") from None
    vals.update({n: np.asarray(v) for n, v in zip(names, values)})
    vals.update(feed)
    return vals


# -- the rewrite ----------------------------------------------------------------------------------------
_ONNX_NP: dict[int, Any] = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.INT16: np.int16,
}


def _load(model: ModelLike, label: str | None = None) -> tuple[onnx.ModelProto, str]:
    if isinstance(model, onnx.ModelProto):
        return model, label or model.graph.name or "model"
    path = Path(model)
    if not path.is_file():
        raise ModelError(f"{path}: model file not found")
    try:
        return onnx.load(str(path)), label or path.name
    except Exception as exc:
        raise ModelError(f"{path}: not an ONNX model ({exc})") from None


def _real_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def _dims(vi: onnx.ValueInfoProto) -> list[Union[int, str]]:
    out: list[Union[int, str]] = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?"))
    return out


def has_dynamic_batch(model: ModelLike) -> bool:
    """True when every input's first dimension is already symbolic (nothing to rewrite)."""
    proto, _ = _load(model)
    ins = _real_inputs(proto.graph)
    return bool(ins) and all(_dims(i) and not isinstance(_dims(i)[0], int) for i in ins)


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
    proto, label = _load(model, label)
    graph = proto.graph
    ins = _real_inputs(graph)
    if not ins:
        raise BatchRewriteError(f"{label}: the model has no inputs")
    if has_dynamic_batch(proto):
        return BatchRewrite(copy.deepcopy(proto), (), already_dynamic=True)
    feed: dict[str, np.ndarray] = {}
    batched: list[str] = []
    for vi in ins:
        dims = _dims(vi)
        if any(not isinstance(d, int) for d in dims):
            raise BatchRewriteError(f"{label}: input {vi.name} has dynamic dimensions {dims}; batch rewriting needs "
                                    "every other dimension fixed")
        if not dims or dims[0] != 1:
            raise BatchRewriteError(f"{label}: input {vi.name} has shape {dims}, not a batch of 1 on axis 0")
        dtype = _ONNX_NP.get(vi.type.tensor_type.elem_type)
        if dtype is None:
            raise BatchRewriteError(f"{label}: input {vi.name} has a tensor type edgert cannot feed")
        feed[vi.name] = np.zeros([int(d) for d in dims], dtype=dtype)
        batched.append(vi.name)
    an = _Analysis(proto, label)
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
    for vi in _real_inputs(g):
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


def make_batch_dynamic(model: ModelLike) -> onnx.ModelProto:
    """The model with a symbolic batch dimension ``batch``; see :func:`rewrite_batch`."""
    return rewrite_batch(model).model


# -- checking -------------------------------------------------------------------------------------------
def _session(model: onnx.ModelProto, threads: int) -> Any:
    ort = lazy_import("onnxruntime", "checking a batch rewrite")
    so = ort.SessionOptions()
    so.log_severity_level = 4
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])


def check_batch_rewrite(original: ModelLike, rewritten: ModelLike, batches: Sequence[int] = (1, 2, 4),
                        rtol: float = 1e-4, seed: int = 0, threads: int = 0,
                        label: str | None = None) -> list[dict[str, Any]]:
    """Run both on ONNX Runtime CPU: row i of the rewritten model at batch B must equal the original on input i.

    Inputs are B different random images-like tensors. The error of a row is ``max|got - want|`` over the
    largest ``|want|`` of that output, so values near zero do not make the check flaky; it must stay within
    ``rtol``. Returns one record per batch size; raises :class:`BatchRewriteError` naming the first
    output, batch and row that differ.
    """
    orig, label = _load(original, label)
    rew, _ = _load(rewritten)
    if not batches or min(batches) < 1:
        raise BatchRewriteError(f"{label}: batch sizes to check must be 1 or more, got {list(batches)}")
    for vi in _real_inputs(orig.graph):
        if any(not isinstance(d, int) for d in _dims(vi)):
            raise BatchRewriteError(f"{label}: input {vi.name} of the original has dynamic dimensions "
                                    f"{_dims(vi)}; the check feeds batch-1 inputs of fixed size")
    s_orig, s_rew = _session(orig, threads), _session(rew, threads)
    rng = np.random.default_rng(seed)
    n = max(batches)
    rows: list[dict[str, np.ndarray]] = []
    for _ in range(n):
        row: dict[str, np.ndarray] = {}
        for a in s_orig.get_inputs():
            shape = [int(d) for d in a.shape]
            if a.type == "tensor(float)":
                row[a.name] = rng.random(shape, dtype=np.float32)
            elif a.type == "tensor(float16)":
                row[a.name] = rng.random(shape, dtype=np.float32).astype(np.float16)
            else:
                row[a.name] = np.zeros(shape, dtype=_ONNX_NP.get(onnx.TensorProto.INT64, np.int64))
        rows.append(row)
    names = [o.name for o in s_orig.get_outputs()]
    want = [s_orig.run(names, r) for r in rows]
    results: list[dict[str, Any]] = []
    for b in batches:
        feed = {k: np.concatenate([r[k] for r in rows[:b]], axis=0) for k in rows[0]}
        got = s_rew.run(names, feed)
        worst = 0.0
        for oi, name in enumerate(names):
            g = np.asarray(got[oi])
            if g.shape[0] != b:
                raise BatchRewriteError(f"{label}: the rewritten model's output {name} has {g.shape[0]} rows at "
                                        f"batch {b}")
            for r in range(b):
                w = np.asarray(want[r][oi])
                gr = g[r:r + 1]
                if gr.shape != w.shape:
                    raise BatchRewriteError(f"{label}: output {name} row {r} at batch {b} has shape "
                                            f"{list(gr.shape)}, the original gives {list(w.shape)}")
                if w.size == 0:
                    continue
                scale = float(np.max(np.abs(w.astype(np.float64))))
                err = float(np.max(np.abs(gr.astype(np.float64) - w.astype(np.float64))))
                rel = err / scale if scale > 0 else err
                if not np.isfinite(rel) or rel > rtol:
                    raise BatchRewriteError(f"{label}: the batch rewrite changes output {name} at batch {b} row "
                                            f"{r} (relative error {rel:.2g} > {rtol:g}); not batching this model")
                worst = max(worst, rel)
        results.append({"batch": b, "max_rel_err": worst})
    return results


# -- the cache ------------------------------------------------------------------------------------------
def batch_cache_dir() -> Path:
    """``$EDGERT_CACHE_DIR/batch`` (or ``$XDG_CACHE_HOME/edgert/batch``, ``~/.cache/edgert/batch``).

    The same root as the engine and timing caches (edgert.build.timing_cache), read here without
    importing the builder.
    """
    env = os.environ.get("EDGERT_CACHE_DIR")
    if env:
        return Path(env) / "batch"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edgert" / "batch"


# Part of the cache key with the source's sha256: bump it when the rewrite changes what it writes.
_RECORD_VERSION = 1


def batched_model_path(model_path: str | Path, cache_dir: str | Path | None = None,
                       check: Sequence[int] = (1, 2)) -> Path:
    """A model file with a dynamic batch for ``model_path``: itself when it has one already, else the
    checked rewrite, cached by the source's sha256 (``<stem>-<sha12>.batch.onnx`` and a ``.json`` record).

    A model that cannot be rewritten is cached too (the record holds the reason), so a pipeline pays for
    the analysis once; both cases raise :class:`BatchRewriteError` with the same one-line message.
    """
    src = Path(model_path)
    if not src.is_file():
        raise ModelError(f"{src}: model file not found")
    sha = sha256_file(src)
    root = Path(cache_dir) if cache_dir is not None else batch_cache_dir()
    out = root / f"{src.stem}-{sha[:12]}.batch.onnx"
    rec_path = out.with_suffix(".json")
    try:
        rec = json.loads(rec_path.read_text())
    except (OSError, ValueError):
        rec = None
    if isinstance(rec, dict) and rec.get("version") == _RECORD_VERSION and rec.get("source_sha256") == sha:
        if rec.get("error"):
            raise BatchRewriteError(str(rec["error"]))
        if rec.get("already_dynamic"):
            return src
        if out.is_file() and rec.get("sha256") and rec["sha256"] == sha256_file(out):
            return out
    proto, label = _load(src)
    if has_dynamic_batch(proto):
        replace_file(rec_path, (json.dumps({"version": _RECORD_VERSION, "source": str(src), "source_sha256": sha,
                                             "already_dynamic": True}, indent=2) + "\n").encode())
        return src
    try:
        res = rewrite_batch(proto, label)
        checked = check_batch_rewrite(proto, res.model, check, label=label) if check else []
    except BatchRewriteError as exc:
        msg = str(exc)
        replace_file(rec_path, (json.dumps({"version": _RECORD_VERSION, "source": str(src), "source_sha256": sha,
                                             "error": msg}, indent=2) + "\n").encode())
        raise

    data = res.model.SerializeToString()
    replace_file(out, data)
    replace_file(rec_path, (json.dumps({
        "version": _RECORD_VERSION, "source": str(src), "source_sha256": sha,
        "sha256": hashlib.sha256(data).hexdigest(), "changes": list(res.changes), "check": checked,
    }, indent=2) + "\n").encode())
    log.info("%s: batch made dynamic (%d changes), checked at batch %s: %s", label, len(res.changes),
             ",".join(str(b) for b in check), out)
    return out
