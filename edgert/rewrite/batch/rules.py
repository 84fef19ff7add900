"""Op rules for batched data: where each op takes the batch axis, and the constants it must change.

:meth:`Analysis.run` walks the graph once from the inputs; each node that reads a batched tensor is handed to
the rule for its op type in :data:`DATA_RULES` (or, when its inputs are shape values that depend on the
batch, to :data:`~edgert.rewrite.batch.shape_rules.SHAPE_RULES`). A rule returns what each output carries
(:class:`~edgert.rewrite.batch.values.Info`) and records the constants to rewrite; an op with no rule, or a
use of the batch a rule cannot keep, is refused with one line naming the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper

from edgert.rewrite.batch.base import attr, norm, subgraph_reads
from edgert.rewrite.batch.shape_rules import ShapeRules
from edgert.rewrite.batch.values import Info, Lin, Unsupported, sym_or_none

__all__ = ["DATA_RULES", "Analysis"]

INT64_MAX = int(np.iinfo(np.int64).max)

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
_AXIS_OPS = frozenset({"Softmax", "LogSoftmax", "Hardmax", "LpNormalization"})
_REDUCE = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
})



class Analysis(ShapeRules):
    """The batch analysis of one model: :meth:`run` from the inputs, one rule per op (:data:`DATA_RULES`)."""

    def run(self, inputs: Sequence[str]) -> None:
        for name in inputs:
            self.info[name] = Info(axis=0)
        for i, node in enumerate(self.graph.node):
            touched = [self.info.get(n) if n else None for n in node.input]
            if not any(t is not None for t in touched):
                # A subgraph (If, Loop) may read batched tensors of this scope without naming them as inputs.
                if any(n in self.info for n in subgraph_reads(node)):
                    raise self.fail(node, "has a subgraph that reads the batch; batch rewriting does not enter "
                                          "subgraphs")
                continue  # the same at every batch: its value is the probe's
            try:
                outs = self.node(i, node, touched)
            except Unsupported as exc:
                raise self.fail(node, str(exc)) from None
            for name, inf in zip(node.output, outs):
                if name and inf is not None:
                    self.info[name] = inf

    def node(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        """What each output of ``node`` carries, by the rule for its op type."""
        n_out = len(node.output)
        if node.domain not in ("", "ai.onnx"):
            raise Unsupported(f"is a {node.domain} op, not known to keep the batch dimension")
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise Unsupported("has a subgraph; batch rewriting does not enter subgraphs")
        if any(x is not None and x.sym is not None for x in t):  # shape tensors: values that depend on the batch
            return [self.sym_node(i, node, t)] + [None] * (n_out - 1)
        rule = DATA_RULES.get(node.op_type)
        if rule is None:
            self.batched(node, t)
            raise Unsupported("is not known to keep the batch dimension")
        return rule(self, i, node, t)

    def batched(self, node: onnx.NodeProto, t: list[Info | None]) -> tuple[int, tuple[int, ...], int]:
        """(batch axis, shape at batch 1, rank) of the data input, which must carry the batch."""
        t0 = t[0] if t else None
        if t0 is None:
            raise Unsupported("takes the batch in a parameter input")
        assert t0.axis is not None
        in_shape = self.shape(node.input[0])
        return t0.axis, in_shape, len(in_shape)

    # -- ops whose inputs may carry the batch anywhere ----------------------------------------------
    def unary(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        t0 = t[0] if t else None
        if any(x is not None for x in t[1:]):
            raise Unsupported("takes the batch in a parameter input")
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            scale = self.const(node, 1)
            if scale is not None and scale.ndim == 1 and scale.size > 1:
                axis = norm(int(attr(node, "axis", 1)), len(self.shape(node.input[0])))
                if t0 is not None and axis == t0.axis:
                    raise Unsupported("quantizes per channel along the batch axis")
        return [Info(axis=t0.axis) if t0 is not None else None] * len(node.output)

    def broadcast(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        return [self.broadcast_axis(node, t)]

    def nchw(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        """Ops whose batch is axis 0 of input 0 and stays axis 0 (N of NCHW)."""
        t0 = t[0] if t else None
        n_out = len(node.output)
        if t0 is None or t0.axis != 0 or any(x is not None for x in t[1:]):
            raise Unsupported("expects the batch on axis 0 of its data input only")
        if node.op_type == "MaxPool":  # Indices are per image too
            return [Info(axis=0)] * n_out
        return [Info(axis=0)] + [None] * (n_out - 1)  # BatchNormalization's running stats are not

    # -- ops on a batched data input ----------------------------------------------------------------
    def axis_op(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        """Softmax, LogSoftmax, Hardmax, LpNormalization: along one axis, which must not be the batch."""
        k, _, rank = self.batched(node, t)
        op = node.op_type
        default = -1 if (self.opset >= 13 or op == "LpNormalization") else 1
        axis = norm(int(attr(node, "axis", default)), rank)
        if axis == k or (self.opset < 13 and op != "LpNormalization" and axis <= k):
            raise Unsupported(f"normalizes along the batch axis (axis {axis})")
        return [Info(axis=k)]

    def layer_norm(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        axis = norm(int(attr(node, "axis", -1)), rank)
        if axis <= k:
            raise Unsupported(f"normalizes over the batch axis (axis {axis})")
        return [Info(axis=k)] * len(node.output)  # Mean and InvStdDev keep the leading dims

    def transpose(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        perm = list(attr(node, "perm", list(range(rank))[::-1]))
        return [Info(axis=perm.index(k))]

    def concat(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        self.batched(node, t)
        return [self.concat_axis(i, node, t)]

    def split(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        axis = norm(int(attr(node, "axis", 0)), rank)
        if axis == k:
            raise Unsupported("splits along the batch axis")
        if len(t) > 1 and t[1] is not None:
            raise Unsupported("takes its split sizes from the batch")
        return [Info(axis=k)] * len(node.output)

    def slice(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        return [self.slice_axis(i, node, k, rank)]

    def gather(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        axis = norm(int(attr(node, "axis", 0)), rank)
        idx = self.const(node, 1)
        if axis == k:
            raise Unsupported("gathers along the batch axis")
        assert idx is not None
        return [Info(axis=k + idx.ndim - 1 if axis < k else k)]

    def unsqueeze(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        axes = self.axes(node, 1)
        assert axes is not None
        out_rank = rank + len(axes)
        axes = sorted(norm(a, out_rank) for a in axes)
        free = [p for p in range(out_rank) if p not in axes]
        return [Info(axis=free[k])]

    def squeeze(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, in_shape, _ = self.batched(node, t)
        return [self.squeeze_axis(i, node, k, in_shape)]

    def reshape(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, in_shape, _ = self.batched(node, t)
        return [self.reshape_axis(i, node, k, in_shape)]

    def flatten(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, in_shape, rank = self.batched(node, t)
        axis = norm(int(attr(node, "axis", 1)), rank)
        if k < axis and int(np.prod(in_shape[:axis])) == 1:
            return [Info(axis=0)]
        if k >= axis and int(np.prod(in_shape[axis:])) == 1:
            return [Info(axis=1)]
        raise Unsupported(f"folds the batch into another dimension (flatten at axis {axis} of shape "
                          f"{list(in_shape)})")

    def expand(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        shape = self.const(node, 1)
        assert shape is not None
        out_rank = max(rank, shape.size)
        kk = k + out_rank - rank
        p = kk - (out_rank - shape.size)
        if p >= 0 and int(shape[p]) != 1:
            raise Unsupported(f"expands the batch axis to {int(shape[p])}")
        return [Info(axis=kk)]

    def tile(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, _ = self.batched(node, t)
        reps = self.const(node, 1)
        assert reps is not None
        if int(reps[k]) != 1:
            raise Unsupported(f"tiles along the batch axis ({int(reps[k])} repeats)")
        return [Info(axis=k)]

    def pad(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        self.check_pad(node, k, rank)
        return [Info(axis=k)]

    def resize(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        """Resize and Upsample: the batch must stay on axis 0 and be scaled by 1."""
        k, _, _ = self.batched(node, t)
        if k != 0:
            raise Unsupported("expects the batch on axis 0")
        self.check_resize(i, node)
        return [Info(axis=0)]

    def matmul(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        self.batched(node, t)
        return [self.matmul_axis(node, t)]

    def gemm(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, _ = self.batched(node, t)
        if any(x is not None for x in t[1:]):
            raise Unsupported("takes the batch in its B or C input")
        if k != (1 if attr(node, "transA", 0) else 0):
            raise Unsupported("contracts over the batch axis")
        return [Info(axis=0)]

    def reduce(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        """The Reduce* ops, ArgMax and ArgMin: over axes that must not hold the batch."""
        k, _, rank = self.batched(node, t)
        return [self.reduce_axis(node, k, rank)]

    def top_k(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        axis = norm(int(attr(node, "axis", -1)), rank)
        self.const(node, 1)
        if axis == k:
            raise Unsupported("takes the top k along the batch axis")
        return [Info(axis=k)] * len(node.output)

    def cum_sum(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, _, rank = self.batched(node, t)
        cum_axis = self.const(node, 1)
        assert cum_axis is not None
        if norm(int(cum_axis), rank) == k:
            raise Unsupported("sums along the batch axis")
        return [Info(axis=k)]

    def shape_of(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        """Shape of a batched tensor: shape values, one of which is the batch."""
        k, in_shape, rank = self.batched(node, t)
        start = norm(int(attr(node, "start", 0)), rank)
        end = attr(node, "end", None)
        end = rank if end is None else min(norm(int(end), rank), rank)
        sym = np.empty(rank, dtype=object)
        for p, d in enumerate(in_shape):
            sym[p] = Lin(1, 0) if p == k else Lin(0, d)
        return [sym_or_none(sym[start:end])]

    def size(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> list[Info | None]:
        k, in_shape, _ = self.batched(node, t)
        other = int(np.prod([d for p, d in enumerate(in_shape) if p != k]))
        return [Info(sym=np.array(Lin(other, 0), dtype=object))]

    # -- what the rules share -------------------------------------------------------------------------
    def broadcast_axis(self, node: onnx.NodeProto, t: list[Info | None]) -> Info:
        shapes = [self.shape(n) if n else () for n in node.input]
        out_rank = max(len(s) for s in shapes)
        pos = {x.axis + out_rank - len(s) for x, s in zip(t, shapes) if x is not None and x.axis is not None}
        if len(pos) != 1:
            raise Unsupported("combines inputs whose batch axes do not line up")
        kk = pos.pop()
        for x, s in zip(t, shapes):
            if x is None:
                p = kk - (out_rank - len(s))
                if p >= 0 and s[p] != 1:
                    raise Unsupported(f"broadcasts the batch against a dimension of {s[p]}")
        return Info(axis=kk)

    def concat_axis(self, i: int, node: onnx.NodeProto, t: list[Info | None]) -> Info:
        rank = len(self.shape(node.input[0]))
        axis = norm(int(attr(node, "axis", 0)), rank)
        ks = {x.axis for x in t if x is not None}
        if len(ks) != 1:
            raise Unsupported("concatenates inputs whose batch axes differ")
        k = ks.pop()
        assert k is not None
        if axis == k:
            raise Unsupported("concatenates along the batch axis")
        # A batch-independent input (a grid, an anchor table) has 1 there: expand it to the batch.
        ref = next(n for n, x in zip(node.input, t) if x is not None)
        for idx, (name, x) in enumerate(zip(node.input, t)):
            if x is None:
                self.expand_to_batch(i, node, idx, name, ref, k, rank)
        return Info(axis=k)

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

    def slice_axis(self, i: int, node: onnx.NodeProto, k: int, rank: int) -> Info:
        if any(self.info.get(n) is not None for n in node.input[1:] if n):
            raise Unsupported("takes its slice bounds from the batch")
        if self.opset < 10:
            axes = attr(node, "axes", None)
            if axes is None or k in [norm(int(a), rank) for a in axes]:
                raise Unsupported("slices the batch axis (opset < 10 attribute form)")
            return Info(axis=k)
        starts = self.const(node, 1)
        ends = self.const(node, 2)
        assert starts is not None and ends is not None
        axes_v = self.const(node, 3)
        steps = self.const(node, 4)
        axes = list(range(len(starts))) if axes_v is None else [norm(int(a), rank) for a in axes_v]
        if k not in axes:
            return Info(axis=k)
        j = axes.index(k)
        step = 1 if steps is None else int(steps[j])
        start, end = int(starts[j]), int(ends[j])
        if step != 1 or (start not in (0,) and start > -(1 << 62)) or end < 1:
            raise Unsupported(f"slices the batch axis ({start}:{end}:{step}), so rows would be dropped")
        if end < INT64_MAX:
            new = np.array(ends, copy=True)
            new[j] = INT64_MAX
            self.replace_input(i, node, 2, new.astype(ends.dtype), f"slice end on the batch axis {end} -> INT64_MAX")
            if start != 0:
                new_s = np.array(starts, copy=True)
                new_s[j] = 0
                self.new_inputs[(i, 1)] = new_s
        return Info(axis=k)

    def squeeze_axis(self, i: int, node: onnx.NodeProto, k: int, in_shape: tuple[int, ...]) -> Info:
        rank = len(in_shape)
        axes = self.axes(node, 1)
        if axes is None:
            # Every 1-sized dim goes, the batch among them at batch 1: what follows expects no batch axis.
            raise Unsupported("squeezes every dimension of size 1, the batch among them")
        axes = [norm(a, rank) for a in axes]
        if k in axes:
            raise Unsupported("squeezes out the batch axis")
        return Info(axis=k - sum(1 for a in axes if a < k))

    def reshape_axis(self, i: int, node: onnx.NodeProto, k: int, in_shape: tuple[int, ...]) -> Info:
        out_shape = self.shape(node.output[0])
        target = self.const(node, 1)
        assert target is not None
        allowzero = int(attr(node, "allowzero", 0))
        pre = int(np.prod(in_shape[:k]))
        cands = [j for j, d in enumerate(out_shape) if d == 1 and int(np.prod(out_shape[:j])) == pre]
        if not cands:
            raise Unsupported(f"folds the batch into another dimension (shape {list(in_shape)} -> "
                               f"{list(out_shape)})")
        j = k if k in cands else cands[0]
        new = [int(v) for v in target.reshape(-1)]
        if new[j] == 0 and not allowzero and j == k:
            return Info(axis=j)  # already copies the input's batch
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
        return Info(axis=j)

    def check_pad(self, node: onnx.NodeProto, k: int, rank: int) -> None:
        pads = attr(node, "pads", None)
        if pads is None:
            v = self.const(node, 1)
            pads = [] if v is None else [int(x) for x in v]
        axes_v = self.const(node, 3)
        axes = list(range(rank)) if axes_v is None else [norm(int(a), rank) for a in axes_v]
        if k in axes and pads:
            j = axes.index(k)
            if int(pads[j]) or int(pads[j + len(axes)]):
                raise Unsupported("pads the batch axis")

    def check_resize(self, i: int, node: onnx.NodeProto) -> None:
        if node.op_type == "Upsample" or self.opset < 11:
            scales = attr(node, "scales", None)
            if scales is None:
                v = self.const(node, 1)
                scales = None if v is None else v.tolist()
            if scales is not None and float(scales[0]) != 1.0:
                raise Unsupported("scales the batch axis")
            return
        scales_v = self.const(node, 2)
        sizes = self.const(node, 3)
        axes = attr(node, "axes", None)
        if axes is not None and 0 not in [int(a) for a in axes]:
            return
        if scales_v is not None and scales_v.size and float(scales_v.reshape(-1)[0]) != 1.0:
            raise Unsupported("scales the batch axis")
        if sizes is not None and sizes.size:
            self.resize_sizes_to_scales(i, node, sizes, axes)

    def resize_sizes_to_scales(self, i: int, node: onnx.NodeProto, sizes: np.ndarray, axes: Any) -> None:
        """``sizes`` pins the batch at 1; the same output from ``scales`` (batch 1.0) where floor(in x scale)
        gives back every size exactly, so ONNX Runtime and TensorRT compute the same coordinates."""
        if attr(node, "keep_aspect_ratio_policy", b"stretch") not in (b"stretch", "stretch"):
            raise Unsupported("sets a fixed output size with a kept aspect ratio on the batch axis")
        in_shape = self.shape(node.input[0])
        dims = list(range(len(in_shape))) if axes is None else [norm(int(a), len(in_shape)) for a in axes]
        scales = np.array([1.0 if d == 0 else float(sz) / in_shape[d] for d, sz in zip(dims, sizes.tolist())],
                          np.float32)
        for d, sz, sc in zip(dims, sizes.tolist(), scales.tolist()):
            if d != 0 and int(np.floor(np.float32(in_shape[d]) * np.float32(sc))) != int(sz):
                raise Unsupported(f"sets a fixed output size (Resize sizes {sizes.tolist()}) that no scale "
                                   "reproduces exactly")
        while len(node.input) < 3:
            node.input.append("")
        self.replace_input(i, node, 2, scales, f"sizes {sizes.tolist()} -> scales {scales.tolist()}")
        self.new_inputs[(i, 3)] = np.array("", dtype=object)  # sizes dropped: scales alone

    def matmul_axis(self, node: onnx.NodeProto, t: list[Info | None]) -> Info:
        a_shape, b_shape = self.shape(node.input[0]), self.shape(node.input[1])
        ra, rb = len(a_shape), len(b_shape)
        out_rank = max(ra, rb, 2)
        pos = set()
        if t[0] is not None:
            ka = t[0].axis
            assert ka is not None
            if ka == ra - 1:
                raise Unsupported("contracts over the batch axis")
            pos.add(out_rank - 2 if ka == ra - 2 else ka + out_rank - ra)
        if len(t) > 1 and t[1] is not None:
            kb = t[1].axis
            assert kb is not None
            if kb >= rb - 2:
                raise Unsupported("takes the batch in its right-hand matrix")
            pos.add(kb + out_rank - rb)
        if len(pos) != 1:
            raise Unsupported("multiplies inputs whose batch axes do not line up")
        kk = pos.pop()
        if t[1] is None and kk < out_rank - 2:
            p = kk - (out_rank - rb)
            if p >= 0 and b_shape[p] != 1:
                raise Unsupported(f"broadcasts the batch against a dimension of {b_shape[p]}")
        return Info(axis=kk)

    def reduce_axis(self, node: onnx.NodeProto, k: int, rank: int) -> Info:
        keep = int(attr(node, "keepdims", 1))
        if node.op_type in ("ArgMax", "ArgMin"):
            axes: list[int] | None = [int(attr(node, "axis", 0))]
        else:
            axes = self.axes(node, 1)
        if not axes:
            if int(attr(node, "noop_with_empty_axes", 0)):
                return Info(axis=k)
            raise Unsupported("reduces over every axis, the batch among them")
        axes = [norm(a, rank) for a in axes]
        if k in axes:
            raise Unsupported("reduces over the batch axis")
        return Info(axis=k if keep else k - sum(1 for a in axes if a < k))


_DataRule = Callable[[Analysis, int, onnx.NodeProto, "list[Info | None]"], "list[Info | None]"]

#: op type -> the rule for a node of it that reads batched data. To follow a new op: one method above and
#: one row here (and, if it computes shapes, one in SHAPE_RULES).
DATA_RULES: dict[str, _DataRule] = {
    **dict.fromkeys(_UNARY, Analysis.unary),
    **dict.fromkeys(_BROADCAST, Analysis.broadcast),
    **dict.fromkeys(_NCHW, Analysis.nchw),
    **dict.fromkeys(_AXIS_OPS, Analysis.axis_op),
    "LayerNormalization": Analysis.layer_norm,
    "Transpose": Analysis.transpose,
    "Concat": Analysis.concat,
    "Split": Analysis.split,
    "Slice": Analysis.slice,
    "Gather": Analysis.gather,
    "Unsqueeze": Analysis.unsqueeze,
    "Squeeze": Analysis.squeeze,
    "Reshape": Analysis.reshape,
    "Flatten": Analysis.flatten,
    "Expand": Analysis.expand,
    "Tile": Analysis.tile,
    "Pad": Analysis.pad,
    "Resize": Analysis.resize,
    "Upsample": Analysis.resize,
    "MatMul": Analysis.matmul,
    "Gemm": Analysis.gemm,
    **dict.fromkeys((*_REDUCE, "ArgMax", "ArgMin"), Analysis.reduce),
    "TopK": Analysis.top_k,
    "CumSum": Analysis.cum_sum,
    "Shape": Analysis.shape_of,
    "Size": Analysis.size,
}
