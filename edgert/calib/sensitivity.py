"""Mixed precision on a compute budget: float islands where they cost the fewest INT8 multiply-accumulates.

1. Each quantized layer's own INT8 error, all in one run per frame (:mod:`.layer_error`: the noise-to-signal
   ratio of its output with exact inputs), on a few frames spread over the check set.
2. Candidates ranked by error per MAC returned to float (:mod:`.macs`), so a cheap layer that hurts goes
   before an expensive one that hurts a little more. Residual Adds are not candidates: TensorRT fuses one into
   the Conv before it, and a float one keeps that Conv's output float. The *output layers* (weighted layers
   whose outputs reach the decoding tail without another weighted layer: the head's last convs) are one
   candidate, a region, whose error per MAC counts double: kept float, it joins the float tail and costs no
   extra reformat.
3. Repair within the budget: the longest prefix of the ranking whose MACs fit ``max_float`` of the model's is
   measured first (detection mAP against FP32 detections on the check set). If it misses the target, it is
   kept and the target is not met (one run). If it meets it, the shortest prefix that still does is found by
   bisection (about log2 of the candidates in runs), so as few float islands as possible remain. Full INT8
   is measured only in that case (``calibrate`` does not check it first: when the budget's float layers miss
   the target, full INT8 cannot be expected to meet it, and one check-set run is saved).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgert.atomic_file import scratch_folder
from edgert.calib.accuracy import _iou
from edgert.calib.layer_error import layer_errors
from edgert.calib.qdq import GraphPlan, write_qdq
from edgert.rewrite.graph import WEIGHTED, activation_graph
from edgert.vision.detections import Detections

__all__ = ["SensitivityResult", "find_float_layers", "output_layers", "rank_candidates"]

log = logging.getLogger(__name__)


@dataclass
class SensitivityResult:
    float_layers: list[str]  # nodes left unquantized
    scores: dict[str, float]  # node -> its own INT8 output error (NSR, layer_error.layer_errors)
    steps: list[dict[str, Any]] = field(default_factory=list)  # {"float_layers": n, "float_macs": f, "map50_95": x}
    target_met: bool = False
    reasons: dict[str, str] = field(default_factory=dict)  # node kept float -> why, for the report
    macs: dict[str, int] = field(default_factory=dict)  # node -> multiply-accumulates
    budget_macs: int = 0  # at most this many MACs may go back to float
    accuracy: dict[str, Any] | None = None  # the check-set report of the chosen model (None: nothing measured)

    def to_dict(self) -> dict[str, Any]:
        worst = sorted(self.scores.items(), key=lambda kv: -kv[1])[:10]
        return {
            "float_layers": self.float_layers, "target_met": self.target_met, "steps": self.steps,
            "reasons": {n: self.reasons[n] for n in self.float_layers if n in self.reasons},
            "budget_macs": self.budget_macs,
            "most_sensitive": [{"node": k, "error": round(v, 6), "macs": self.macs.get(k)} for k, v in worst],
        }


def localization_error(reference: Sequence[Detections], candidate: Sequence[Detections]) -> float | None:
    """Mean over reference boxes of ``1 - IoU`` with the best same-class candidate box plus the mean
    absolute change of that box's confidence; ``None`` when the reference found nothing."""
    losses: list[float] = []
    for ref, cand in zip(reference, candidate):
        for c in np.unique(ref.class_id):
            r = ref.class_id == c
            k = cand.class_id == c
            if not k.any():
                losses.extend([2.0] * int(r.sum()))  # missed entirely: IoU 0 and confidence gone
                continue
            ious = _iou(ref.xyxy[r], cand.xyxy[k])
            best = ious.argmax(axis=1)
            iou = ious[np.arange(best.size), best]
            dconf = np.abs(ref.confidence[r] - cand.confidence[k][best])
            losses.extend((1.0 - iou + dconf).tolist())
    return float(np.mean(losses)) if losses else None


def _steps(limit: int) -> list[int]:
    out, n = [], 1
    while n < limit:
        out.append(n)
        n = max(n + 1, round(n * 1.4))
    return [*out, limit]


def output_layers(model: onnx.ModelProto, plan: GraphPlan) -> list[str]:
    """Targets whose outputs reach the decoding tail (or a graph output) through no other weighted layer."""
    act = activation_graph(model)
    targets = {t.node for t in plan.targets}
    tail = set(plan.tail_nodes)
    outputs = {o.name for o in model.graph.output}
    found: list[str] = []
    for node in act.dynamic_nodes:
        if node.name not in targets or node.op_type not in WEIGHTED:
            continue
        stack, seen, reaches = list(node.output), set(), False
        while stack and not reaches:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in outputs:
                reaches = True
            for c in act.consumers.get(t, []):
                if c.name in tail:
                    reaches = True
                elif c.op_type not in WEIGHTED:
                    stack.extend(c.output)
        if reaches:
            found.append(node.name)
    return found


#: The output region's error per MAC counts this many times: kept float, it joins the float tail and adds no
#: reformat, where a scattered float layer costs TensorRT two.
REGION_BONUS = 2.0


def rank_candidates(scores: Mapping[str, float], macs: Mapping[str, int], budget: int,
                    region: Sequence[str] = (), weights: Mapping[str, int] | None = None,
                    size_weight: float = 0.0) -> list[tuple[str, str]]:
    """``(node, reason)`` in the order they go back to float, by INT8 error per MAC. ``region`` (the output
    layers) is one candidate, ranked by its summed error per summed MAC times :data:`REGION_BONUS`, when its
    MACs fit the budget. Layers with no MACs (pools, residual Adds) cost nothing in the budget but rank as
    if they cost the cheapest weighted layer: free in compute, but each float island costs two reformats.

    ``size_weight`` > 0 adds the engine's side of the cost: a unit's cost is its share of the model's MACs
    plus ``size_weight`` times its share of the weight bytes (``weights``: node -> weight elements), so a
    layer whose float weights would grow the engine most (deep 3x3 convs: few MACs, many weights) is
    returned to float later than one that gains as much accuracy for fewer bytes."""
    total = sum(macs.values()) or 1
    wts = weights or {}
    total_w = sum(wts.get(n, 0) for n in macs) or 1
    floor = min((m for m in macs.values() if m > 0), default=1) / total  # a pool or Add ranks as the cheapest

    def cost(members: Sequence[str]) -> float:
        share = sum(macs.get(n, 0) for n in members) / total
        if size_weight > 0:
            share += size_weight * sum(wts.get(n, 0) for n in members) / total_w
        return max(share, floor)

    region = [n for n in region if n in scores and scores[n] > 0]
    region_macs = sum(macs.get(n, 0) for n in region)
    units: list[tuple[float, list[str]]] = []
    grouped: set[str] = set()
    if region and region_macs <= budget:
        units.append((REGION_BONUS * sum(scores[n] for n in region) / cost(region), region))
        grouped = set(region)
    done = {n for _, members in units for n in members}
    units += [(scores[n] / cost([n]), [n]) for n in scores if n not in done and scores[n] > 0]
    units.sort(key=lambda u: -u[0])
    order: list[tuple[str, str]] = []
    for rank, (_, members) in enumerate(units, 1):
        for n in members:
            what = "output layer (joins the float decoding tail), " if n in grouped else ""
            size = f", {100.0 * wts.get(n, 0) / total_w:.2f} % of weights" if size_weight > 0 else ""
            order.append((n, f"{what}INT8 error {scores[n]:.3g} for {100.0 * macs.get(n, 0) / total:.2f} % of "
                             f"MACs{size} (error per {'cost' if size_weight > 0 else 'MAC'} rank {rank})"))
    return order


def find_float_layers(model: onnx.ModelProto, plan: GraphPlan, amax: dict[str, float],
                      evaluate: Callable[[Path], dict[str, Any]],
                      max_drop: float, feeds: Iterable[Mapping[str, np.ndarray]], macs: Mapping[str, int],
                      max_float: float = 0.1, log_fn: Callable[[str], None] | None = None,
                      size_weight: float = 0.0,
                      full_int8_measured: bool = True) -> SensitivityResult:
    """Choose layers to keep in float so that mAP >= 1 - ``max_drop`` with at most ``max_float`` of the
    model's MACs (``macs``: per weighted node) in float (see the module docstring). ``evaluate``: the
    accuracy report of a Q/DQ model file on the check set (``comparison.compare_detectors``'s, with
    ``["map"]["map50_95"]``); the one of the chosen model is kept as ``result.accuracy``. ``feeds``: model
    inputs of the frames the layers' errors are measured on. ``size_weight``: :func:`rank_candidates`'s.
    ``full_int8_measured``: the caller measured full INT8 and it missed the target; when False and the
    budget's layers meet it, full INT8 is measured here (and kept, with no float layer, if it meets it too)."""
    scores = layer_errors(model, plan, amax, feeds)
    total = sum(macs.values())
    budget = int(max_float * total)
    targets = [t.node for t in plan.targets]
    cost = {n: int(macs.get(n, 0)) for n in targets}
    inits = {i.name: i for i in model.graph.initializer}
    weights = {t.node: int(np.prod(inits[t.weight].dims)) for t in plan.targets if t.weight in inits}
    # A residual Add stays INT8: TensorRT fuses it into the Conv before it, and a float one keeps that Conv's
    # output float (a reformat each side) where the INT8 one writes INT8; a float pool costs nothing (TensorRT
    # moves the next layer's quantization through it), so pools stay candidates.
    candidates = {n: v for n, v in scores.items() if n not in {t.node for t in plan.targets if t.op_type == "Add"}}
    ranked = rank_candidates(candidates, cost, budget, output_layers(model, plan), weights, size_weight)
    result = SensitivityResult([], scores, macs=cost, budget_macs=budget)
    reasons = dict(ranked)
    # the longest prefix of the ranking within the budget; a candidate too dear is passed over, not a stop
    chosen_all: list[str] = []
    spent = 0
    for node, _ in ranked:
        if spent + cost[node] <= budget:
            chosen_all.append(node)
            spent += cost[node]
    with scratch_folder("sens") as tmp:  # a killed run's is removed by the next one
        path = tmp / "probe.onnx"

        measured: dict[int, dict[str, Any]] = {}

        def measure(count: int) -> float:
            chosen = chosen_all[:count]
            onnx.save(write_qdq(model, plan, amax, exclude_nodes=chosen), str(path))
            measured[count] = evaluate(path)
            value = float(measured[count]["map"]["map50_95"])
            float_share = sum(cost[n] for n in chosen) / total if total else 0.0
            result.steps.append({"float_layers": count, "float_macs": round(float_share, 4),
                                 "map50_95": round(value, 5)})
            if log_fn:
                log_fn(f"sensitivity: {count} layer(s), {100 * float_share:.1f} % of MACs in float -> "
                       f"mAP@0.5:0.95 {value:.4f}")
            return value

        # The whole budget first: when even that misses the target, nothing smaller is tried (one run, not
        # one per step). When it meets it, bisect for the shortest prefix that still does (fewer float
        # islands), a handful of runs; the curve is noisy, so any prefix measured to meet it will do.
        target = 1.0 - max_drop
        if chosen_all:
            hi = len(chosen_all)
            result.float_layers = chosen_all
            if measure(hi) >= target:
                result.target_met = True
                lo = 0  # full INT8 misses the target: measured by the caller, or now
                if not full_int8_measured and measure(0) >= target:
                    hi = 0
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if measure(mid) >= target:
                        hi = mid
                    else:
                        lo = mid
                result.float_layers = chosen_all[:hi]
            result.accuracy = measured[len(result.float_layers)]
    result.reasons = {n: reasons[n] for n in result.float_layers}
    return result
