"""Mixed precision: find the layers INT8 hurts most and leave them in float until accuracy is back.

1. Sensitivity of each quantized layer: a model with only that layer in INT8 is run on a few frames
   and its detections are matched to FP32's: the score is the mean of ``1 - IoU`` of each FP32 box with
   its best same-class INT8 box plus the mean change of its confidence (mAP@0.5:0.95 rewards boxes
   within a pixel or two, so localization is what to watch; a raw output error would be dominated by
   coordinates' large spread and miss it). Models with no FP32 boxes on those frames fall back to the
   per-feature output error (:func:`~edgert.calib.accuracy.normalized_error`).
2. Greedy repair: the most sensitive layers go back to float in growing steps (1, 2, 3, 4, 6, 8, ...)
   and the whole model is measured (detection mAP against FP32 detections) after each step, until the
   drop is within ``max_drop`` or ``max_float`` of the layers are float (then the best step is kept).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgert.calib.accuracy import _iou, detection_map, normalized_error
from edgert.calib.qdq import GraphPlan, write_qdq
from edgert.config import PipelineConfig
from edgert.vision.detections import Detections

__all__ = ["SensitivityResult", "find_float_layers"]

log = logging.getLogger(__name__)


@dataclass
class SensitivityResult:
    float_layers: list[str]  # nodes left unquantized
    scores: dict[str, float]  # node -> output error with only that node quantized
    steps: list[dict[str, Any]] = field(default_factory=list)  # {"float_layers": n, "map50_95": x}
    target_met: bool = False

    def to_dict(self) -> dict[str, Any]:
        worst = sorted(self.scores.items(), key=lambda kv: -kv[1])[:10]
        return {
            "float_layers": self.float_layers, "target_met": self.target_met, "steps": self.steps,
            "most_sensitive": [{"node": k, "error": round(v, 6)} for k, v in worst],
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


def find_float_layers(model: onnx.ModelProto, plan: GraphPlan, amax: dict[str, float],
                      frames: Sequence[np.ndarray], config: PipelineConfig,
                      reference: tuple[list[Detections], list[dict[str, np.ndarray]]],
                      max_drop: float, score_frames: int = 4, max_float: float = 0.5,
                      progress: bool = False, log_fn: Callable[[str], None] | None = None,
                      write_kwargs: Mapping[str, Any] | None = None) -> SensitivityResult:
    """Choose layers to keep in float so that mAP >= 1 - ``max_drop`` (see the module docstring)."""
    from tqdm import tqdm

    from edgert.calib.comparison import detections_on

    ref_dets, ref_outs = reference
    kw = dict(write_kwargs or {})
    nodes = [t.node for t in plan.targets]
    scores: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="edgert-sens-") as tmp:
        path = Path(tmp) / "probe.onnx"
        # evenly spread over the check set, so each kind of frame in it (see calibrate._check_frames) counts
        few_index = list(range(0, len(frames), max(1, len(frames) // max(score_frames, 1))))[:score_frames]
        few = [frames[i] for i in few_index]
        for node in tqdm(nodes, desc="sensitivity", unit="layer", disable=not progress, leave=False):
            others = [n for n in nodes if n != node]
            onnx.save(write_qdq(model, plan, amax, exclude_nodes=others, **kw), str(path))
            dets, outs = detections_on(path, few, config)
            loss = localization_error([ref_dets[i] for i in few_index], dets)
            if loss is None:
                errs = [normalized_error(ref_outs[i][k], o[k]) for i, o in zip(few_index, outs) for k in ref_outs[i]
                        if k in o]
                loss = float(np.mean(errs)) if errs else 0.0
            scores[node] = loss
        ranked = sorted(nodes, key=lambda n: -scores[n])
        limit = max(1, int(len(nodes) * max_float))
        result = SensitivityResult([], scores)
        best = -1.0
        for step in _steps(limit):
            chosen = ranked[:step]
            onnx.save(write_qdq(model, plan, amax, exclude_nodes=chosen, **kw), str(path))
            dets, _ = detections_on(path, frames, config)
            value = detection_map(ref_dets, dets).map50_95
            result.steps.append({"float_layers": len(chosen), "map50_95": round(value, 5)})
            if log_fn:
                log_fn(f"sensitivity: {len(chosen)} layer(s) in float -> mAP@0.5:0.95 {value:.4f}")
            if value > best:
                best, result.float_layers = value, chosen
            if value >= 1.0 - max_drop:
                result.target_met = True
                result.float_layers = chosen
                break
    return result
