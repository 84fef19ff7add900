"""Activation equalisation: per-channel rescaling between convs that is exact in float (SmoothQuant / CLE).

Activations are quantized per tensor, weights per output channel. A channel whose range is far below its
tensor's largest gets few of the 8 bits. Where only positively homogeneous ops lie between convs
(LeakyReLU(s x) = s LeakyReLU(x) for s > 0; Relu, PRelu, MaxPool, AveragePool, Identity, zero or ``-inf``
constant Pad, Resize on the spatial axes, Concat on the channel axis), dividing output channel ``c`` of the
producing conv A (weights row ``c`` and bias ``c``) by ``d_c`` and multiplying input channel ``c`` of every
consuming conv B (``W_B[:, c]``) by ``d_c`` leaves the float model's outputs as they were, A's per-channel
weight quantization untouched, and the tensors between them divided by ``d_c`` per channel.

``d_c = r_c ** alpha / w_c ** (1 - alpha)`` (SmoothQuant's rule): ``r_c`` the channel's largest ``|x|`` on
the calibration images (one vector per tensor, memory flat in the folder size), ``w_c`` the largest of
``|W_B[o, c]| / max_c' |W_B[o, c']|`` over B's output channels ``o`` (relative to each row's own range,
because B's weights are quantized per row: that ratio is what the rescale changes in B's quantization).
``alpha`` 1 flattens the activations fully, 0 leaves them and flattens the weights' columns.

A *region* is a set of tensors joined by those ops, whose channels each belong to one output channel of
one source conv; it is rescaled only when every consumer of every tensor in it can absorb the scale (an
op above, or a group-1 Conv reading it as data). Anything else (an Add, a Sigmoid, SiLU's Mul, a graph
output, a Split) leaves the whole region alone: :func:`find_regions` says why for each. With
``through_adds`` an Add of two such tensors joins their regions instead (its convs share one ``d``).
Measured on the asset detectors over 13 calibration draws (calibration/README.md): that, and
iterating the ``weights`` pass to convergence, did not pay; both are off by default.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from edgert.calib.qdq import constant_value

__all__ = ["Region", "channel_absmax", "equalize", "find_regions"]

log = logging.getLogger(__name__)

#: Element-wise or per-channel ops with f(s x) = s f(x) for a positive per-channel s (data input 0).
_HOMOGENEOUS = ("Relu", "LeakyRelu", "PRelu", "MaxPool", "AveragePool", "Identity", "Pad", "Resize")


@dataclass
class Region:
    """Tensors that carry the output channels of ``sources`` through homogeneous ops to ``absorbers``."""

    sources: list[str]  # convs whose output channels are divided by d
    absorbers: list[str]  # convs whose input channels are multiplied by d
    segments: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)  # tensor -> its channels
    ties: list[list[str]] = field(default_factory=list)  # sources added together: one d for each group
    why_not: str | None = None  # None: the region can be rescaled


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _homogeneous(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """``node`` commutes with a positive per-channel scale of its data input (input 0)."""
    op = node.op_type
    if op not in _HOMOGENEOUS:
        return False
    if op == "Pad":
        mode = _attr(node, "mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        pads = constant_value(model, node.input[1]) if len(node.input) > 1 and node.input[1] else None
        if pads is None or pads.size % 2 or (len(node.input) > 3 and node.input[3]):
            return False  # pads unknown, or an axes input: cannot tell the channel axis is not padded
        rank = pads.size // 2
        if rank < 2 or pads[1] != 0 or pads[1 + rank] != 0:
            return False
        if mode != "constant":
            return mode in ("reflect", "edge")
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            fill = constant_value(model, node.input[2])
            if fill is None or fill.size != 1:
                return False
            value = float(fill.reshape(-1)[0])
        return value == 0.0 or not math.isfinite(value)  # s * 0 = 0, s * -inf = -inf
    if op == "Resize":
        scales = constant_value(model, node.input[2]) if len(node.input) > 2 and node.input[2] else None
        return scales is not None and scales.size >= 2 and scales[0] == 1 and scales[1] == 1  # not over channels
    return True


def _conv_weights(model: onnx.ModelProto, node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto],
                  uses: Mapping[str, int]) -> str | None:
    """Why ``node`` cannot be rescaled (a source or an absorber), or None when it can."""
    if node.op_type != "Conv":
        return f"{node.op_type} {node.name}"
    if int(_attr(node, "group", 1)) != 1:
        return f"grouped Conv {node.name}"
    for i, t in enumerate(node.input[1:3], start=1):
        if t and (t not in inits or inits[t].data_type != onnx.TensorProto.FLOAT):
            return f"Conv {node.name} (input {i} not a constant float tensor)"
        if t and uses.get(t, 0) > 1:
            return f"Conv {node.name} (its weights are shared with another node)"
    return None


def _tie(segs_a: Sequence[tuple[str, int, int]], segs_b: Sequence[tuple[str, int, int]],
         width: Mapping[str, int]) -> list[tuple[str, str]] | None:
    """The source pairs an Add of tensors with these channels ties (whole convs of one width), or None."""
    if len(segs_a) != len(segs_b):
        return None
    pairs = []
    for (sa, ba, ea), (sb, bb, eb) in zip(segs_a, segs_b):
        if ba or bb or ea != width[sa] or eb != width[sb] or width[sa] != width[sb]:
            return None  # a slice of a conv: its other channels would need the same d too
        pairs.append((sa, sb))
    return pairs


def find_regions(model: onnx.ModelProto, through_adds: bool = False) -> list[Region]:
    """Every region that starts at a Conv's output, with ``why_not`` set where it cannot be rescaled.

    ``through_adds``: an Add of two such tensors (an FPN's lateral conv plus the upsampled level above) joins
    their regions, and the convs whose channels meet in it get one ``d`` (``Region.ties``): ``A / d + B / d
    = (A + B) / d``, so it is still exact. Without it an Add leaves both regions alone."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    uses: dict[str, int] = {}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for t in node.input:
            if t:
                uses[t] = uses.get(t, 0) + 1
                consumers.setdefault(t, []).append(node)
    outputs = {o.name for o in g.output}
    segments: dict[str, list[tuple[str, int, int]]] = {}
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            t = parent[t]
        return t

    def join(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    sources: dict[str, str] = {}  # tensor -> the conv whose output it is
    width: dict[str, int] = {}
    tied: list[tuple[str, str]] = []
    for node in g.node:  # graph order is topological
        if node.op_type == "Conv" and _conv_weights(model, node, inits, uses) is None and node.output:
            w = numpy_helper.to_array(inits[node.input[1]])
            segments[node.output[0]] = [(node.name, 0, int(w.shape[0]))]
            sources[node.output[0]] = node.name
            width[node.name] = int(w.shape[0])
        elif (through_adds and node.op_type == "Add" and len(node.input) == 2 and node.input[0] != node.input[1]
              and all(t in segments for t in node.input)):
            pairs = _tie(segments[node.input[0]], segments[node.input[1]], width)
            if pairs is not None:
                segments[node.output[0]] = list(segments[node.input[0]])
                tied += pairs
                for t in node.input:
                    join(t, node.output[0])
        elif node.op_type == "Concat" and int(_attr(node, "axis", 0)) == 1 and node.input:
            if all(t in segments for t in node.input):
                segments[node.output[0]] = [s for t in node.input for s in segments[t]]
                for t in node.input:
                    join(t, node.output[0])
        elif (node.input and node.input[0] in segments and _homogeneous(model, node)
              and not any(t in segments for t in node.input[1:])):
            segments[node.output[0]] = list(segments[node.input[0]])
            join(node.input[0], node.output[0])
    regions: dict[str, Region] = {}
    for t in segments:
        r = regions.setdefault(find(t), Region([], []))
        r.segments[t] = segments[t]
        if t in sources:
            r.sources.append(sources[t])
    for region in regions.values():
        region.ties = _groups([(a, b) for a, b in tied if a in region.sources])
        absorbers: list[str] = []
        for t in region.segments:
            if t in outputs:
                region.why_not = f"{t} is a graph output"
                break
            for node in consumers.get(t, []):
                if node.output and node.output[0] in region.segments and (node.op_type in ("Concat", "Add") or (
                        node.input[0] == t and t not in node.input[1:] and _homogeneous(model, node))):
                    continue  # a homogeneous op or Concat inside the region
                if node.op_type == "Shape":
                    continue  # reads only the shape, which the scale does not change
                why = _conv_weights(model, node, inits, uses)
                if why is None and node.input[0] == t and t not in node.input[1:]:
                    if node.name not in absorbers:
                        absorbers.append(node.name)
                    continue
                region.why_not = f"{t} feeds {why or node.op_type + ' ' + node.name}"
                break
            if region.why_not:
                break
        region.absorbers = absorbers
        if region.why_not is None and not absorbers:
            region.why_not = "no conv reads it"
    return list(regions.values())


def _groups(pairs: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The connected groups of the pairs' names (each pair: two convs that must share one ``d``)."""
    groups: list[set[str]] = []
    for a, b in pairs:
        hit = [g for g in groups if a in g or b in g]
        merged = {a, b}.union(*hit)
        groups = [g for g in groups if g not in hit] + [merged]
    return [sorted(g) for g in groups]


def channel_absmax(value: np.ndarray) -> np.ndarray:
    """The largest finite ``|x|`` of each channel (axis 1) of an activation (0 where none is finite)."""
    v = np.asarray(value, np.float32)
    if v.ndim < 2:
        return np.zeros(0, np.float32)
    axes = tuple(i for i in range(v.ndim) if i != 1)
    top = np.maximum(v.max(axis=axes), -v.min(axis=axes))  # no |x| copy of the whole tensor
    if np.isfinite(top).all():
        return np.asarray(top, np.float32)
    a = np.abs(v)  # -inf padding and the like: only the finite values count
    return np.asarray(np.where(np.isfinite(a), a, 0.0).max(axis=axes), np.float32)


def _relative_columns(w: np.ndarray) -> np.ndarray:
    """Per input channel of a Conv weight (O, C, ...): max over rows of ``|W[o, c]| / max |W[o, :]|``."""
    a = np.abs(w.astype(np.float64)).reshape(w.shape[0], w.shape[1], -1).max(axis=2)
    rows = a.max(axis=1, keepdims=True)
    return np.asarray((a / np.where(rows > 0, rows, 1.0)).max(axis=0))


def equalize(model: onnx.ModelProto, regions: Sequence[Region], channel_max: Mapping[str, np.ndarray],
             alpha: float = 0.5, ranges: str = "activations", passes: int = 1,
             tolerance: float = 0.01) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """A copy of ``model`` with each rescalable region's channels divided by ``d`` (the module's rule).

    ``channel_max``: per tensor, its per-channel largest ``|x|`` (:func:`channel_absmax` over the images);
    the tensors of a region that have one set ``r``. Returns the model and what was done (per region: its
    sources, absorbers and the spread of its tensors' per-channel ranges before and after). ``ranges``
    "weights": ``r_c`` is the largest ``|W_A[c]|`` instead, no data (Nagel et al.'s cross-layer equalisation
    with ``alpha`` 0.5), so the scales do not follow the calibration images' channel ranges.

    ``passes`` (``weights`` only): the whole graph equalised again, up to this many times, until no scale of
    a pass is further than ``tolerance`` from 1 in log (Nagel et al. iterate CLE to convergence). One pass is
    not a fixed point: a consumer's column range is relative to its row's largest weight, which the pass
    itself changes, and a conv that absorbs one region's scales is the source of the next region's rows.
    The summary's ``largest_log_d`` is each pass's largest ``|log d|``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    out = copy.deepcopy(model)
    inits = {i.name: i for i in out.graph.initializer}
    nodes = {n.name: n for n in out.graph.node}
    live = [r for r in regions if r.why_not is None]
    total: dict[int, dict[str, np.ndarray]] = {}  # region -> source -> the product of its passes' d
    moved: list[float] = []
    for _ in range(passes if ranges == "weights" else 1):  # activation ranges are measured once: one pass
        largest = 0.0
        for i, region in enumerate(live):
            d = _region_scales(region, inits, nodes, channel_max, alpha, ranges)
            if d is None:
                continue
            _apply(region, d, inits, nodes)
            acc = total.setdefault(i, {s: np.ones_like(v) for s, v in d.items()})
            for s, ds in d.items():
                acc[s] = acc[s] * ds
                largest = max(largest, float(np.abs(np.log(ds)).max(initial=0.0)))
        moved.append(round(largest, 4))
        if largest < tolerance:
            break
    done: list[dict[str, Any]] = []
    for i, d in total.items():
        region = live[i]
        spread = []
        for t, segs in region.segments.items():
            got = channel_max.get(t)
            if got is None or not got.size or got.max() <= 0:
                continue
            scaled = got / np.concatenate([d[s][b:e] for s, b, e in segs])
            spread.append({"tensor": t, "median_over_max_before": round(float(np.median(got) / got.max()), 4),
                           "median_over_max_after": round(float(np.median(scaled) / scaled.max()), 4)})
        done.append({"sources": list(region.sources), "absorbers": list(region.absorbers), "tensors": spread,
                     "scaled": sorted(region.segments)})
    not_rescaled = {", ".join(r.sources) or "?": r.why_not for r in regions if r.why_not is not None}
    summary: dict[str, Any] = {
        "alpha": alpha, "ranges": ranges, "passes": len(moved), "largest_log_d": moved, "regions": done,
        "not_rescaled": not_rescaled,
        "rescaled_tensors": sorted({t for x in done for t in x["scaled"]}),
    }
    if done:
        log.info("activation equalisation (alpha %g): %d regions, %d convs rescaled; %d regions left alone",
                 alpha, len(done), sum(len(x["sources"]) for x in done), len(not_rescaled))
    return out, summary


def _region_scales(region: Region, inits: Mapping[str, onnx.TensorProto], nodes: Mapping[str, onnx.NodeProto],
                   channel_max: Mapping[str, np.ndarray], alpha: float, ranges: str) -> dict[str, np.ndarray] | None:
    """Per source conv of ``region``, the ``d`` that divides its output channels (None: no range known)."""
    width = {s: int(numpy_helper.to_array(inits[nodes[s].input[1]]).shape[0]) for s in region.sources}
    r = {s: np.zeros(n) for s, n in width.items()}
    w = {s: np.zeros(n) for s, n in width.items()}
    for s in width if ranges == "weights" else ():
        r[s] = np.abs(numpy_helper.to_array(inits[nodes[s].input[1]])).reshape(width[s], -1).max(axis=1)
    for t, segs in region.segments.items() if ranges == "activations" else ():
        got = channel_max.get(t)
        if got is None or got.size != sum(e - b for _, b, e in segs):
            continue
        at = 0
        for s, b, e in segs:
            r[s][b:e] = np.maximum(r[s][b:e], got[at: at + e - b])
            at += e - b
    for name in region.absorbers:
        node = nodes[name]
        cols = _relative_columns(numpy_helper.to_array(inits[node.input[1]]))
        at = 0
        for s, b, e in region.segments[node.input[0]]:
            w[s][b:e] = np.maximum(w[s][b:e], cols[at: at + e - b])
            at += e - b
    for group in region.ties:  # convs added together: their channels get the larger of their ranges, one d
        r_group = np.max([r[s] for s in group], axis=0)
        w_group = np.max([w[s] for s in group], axis=0)
        for s in group:
            r[s], w[s] = r_group, w_group
    if not any(v.any() for v in r.values()):
        return None
    d: dict[str, np.ndarray] = {}
    for s in width:
        ok = (r[s] > 0) & (w[s] > 0)
        ds = np.ones_like(r[s])
        ds[ok] = r[s][ok] ** alpha / w[s][ok] ** (1.0 - alpha)
        d[s] = ds
    # one factor for the region so its largest range stays where it was (ranges in familiar units)
    top = max(float(r[s].max()) for s in width)
    after = max(float((r[s] / d[s]).max()) for s in width)
    k = after / top if top > 0 and after > 0 else 1.0
    for s in width:
        ok = (r[s] > 0) & (w[s] > 0)
        d[s] = np.where(ok, d[s] * k, 1.0)
    return d


def _apply(region: Region, d: Mapping[str, np.ndarray], inits: Mapping[str, onnx.TensorProto],
           nodes: Mapping[str, onnx.NodeProto]) -> None:
    """Divide each source's row ``c`` and bias ``c`` by ``d_c``; multiply each absorber's column ``c`` by it."""
    for s, ds in d.items():
        node = nodes[s]
        for t in node.input[1:3]:
            if t:
                arr = numpy_helper.to_array(inits[t]).astype(np.float64)
                arr /= ds.reshape((-1,) + (1,) * (arr.ndim - 1))
                inits[t].CopyFrom(numpy_helper.from_array(arr.astype(np.float32), t))
    for name in region.absorbers:
        node = nodes[name]
        t = node.input[1]
        scale = np.concatenate([d[s][b:e] for s, b, e in region.segments[node.input[0]]])
        arr = numpy_helper.to_array(inits[t]).astype(np.float64)
        arr *= scale.reshape((1, -1) + (1,) * (arr.ndim - 2))
        inits[t].CopyFrom(numpy_helper.from_array(arr.astype(np.float32), t))
