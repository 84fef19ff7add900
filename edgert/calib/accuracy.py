"""How close a quantized model stays to its reference: detection mAP and raw output errors.

The reference model's detections are the ground truth (its own errors do not count against the
candidate), so 1.0 means "finds exactly what FP32 finds". mAP is computed the way COCO does it:
per class, greedy matching by descending score to the best still-unmatched box at IoU >= t, precision
made monotone, sampled at 101 recall points, averaged over IoU thresholds 0.50:0.05:0.95 and over the
classes that have ground truth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgert.vision.detections import Detections
from edgert.vision.nms import iou_matrix

__all__ = ["IOU_THRESHOLDS", "MapResult", "OutputErrors", "detection_map", "feature_axis", "normalized_error"]

IOU_THRESHOLDS = np.round(np.linspace(0.5, 0.95, 10), 2)
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
MAX_DETS = 300  # per image (COCO uses 100; 300 is the decoders' max_det, so nothing a decoder keeps is cut)


@dataclass(frozen=True)
class MapResult:
    map50_95: float
    map50: float
    per_class: dict[int, float]  # class id -> AP@0.5:0.95
    ground_truth: int  # reference boxes
    predictions: int  # candidate boxes
    per_class_boxes: dict[int, int] = field(default_factory=dict)  # class id -> reference boxes

    def to_dict(self) -> dict[str, Any]:
        return {
            "map50_95": _num(self.map50_95), "map50": _num(self.map50),
            "per_class": {str(k): _num(v) for k, v in sorted(self.per_class.items())},
            "ground_truth": self.ground_truth, "predictions": self.predictions,
            "per_class_boxes": {str(k): v for k, v in sorted(self.per_class_boxes.items())},
        }


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 5)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU, with identical boxes at 1 even when they have no area (a degenerate box still matches itself)."""
    if not b.shape[0]:
        return np.zeros((a.shape[0], 0), np.float64)
    ious = iou_matrix(a, b)
    same = np.all(a[:, None, :] == b[None, :, :], axis=2)
    return np.where(same, 1.0, ious)


def _ap(tp: np.ndarray, scores: np.ndarray, n_gt: int) -> float:
    """101-point interpolated AP of detections (``tp`` flags) sorted by score."""
    if n_gt == 0:
        return math.nan
    if tp.size == 0:
        return 0.0
    order = np.argsort(-scores, kind="mergesort")
    tp = tp[order].astype(np.float64)
    ctp = np.cumsum(tp)
    cfp = np.cumsum(1.0 - tp)
    recall = ctp / n_gt
    precision = ctp / np.maximum(ctp + cfp, np.finfo(np.float64).eps)
    precision = np.maximum.accumulate(precision[::-1])[::-1]  # monotone envelope
    idx = np.searchsorted(recall, RECALL_POINTS, side="left")
    sampled = np.where(idx < precision.size, precision[np.minimum(idx, precision.size - 1)], 0.0)
    return float(sampled.mean())


def detection_map(reference: Sequence[Detections], candidate: Sequence[Detections],
                  min_score: float = 0.0) -> MapResult:
    """mAP of ``candidate`` detections against ``reference`` detections taken as ground truth."""
    if len(reference) != len(candidate):
        raise ValueError("reference and candidate must cover the same frames")  # an edgert bug
    classes = sorted({int(c) for d in reference for c in d.class_id})
    n_pred = 0
    # per class: per threshold lists of (tp flags, scores); n_gt
    per_class: dict[int, float] = {}
    per_class50: dict[int, float] = {}
    flags: dict[int, list[list[np.ndarray]]] = {c: [[] for _ in IOU_THRESHOLDS] for c in classes}
    scores: dict[int, list[np.ndarray]] = {c: [] for c in classes}
    n_gt: dict[int, int] = dict.fromkeys(classes, 0)
    for ref, cand in zip(reference, candidate):
        keep = cand.confidence >= min_score
        c_xyxy, c_conf, c_cls = cand.xyxy[keep], cand.confidence[keep], cand.class_id[keep]
        if c_conf.size > MAX_DETS:
            top = np.argsort(-c_conf, kind="mergesort")[:MAX_DETS]
            c_xyxy, c_conf, c_cls = c_xyxy[top], c_conf[top], c_cls[top]
        n_pred += int(c_conf.size)
        for c in classes:
            g = ref.xyxy[ref.class_id == c]
            pm = c_cls == c
            p, s = c_xyxy[pm], c_conf[pm]
            n_gt[c] += int(g.shape[0])
            if not s.size:
                continue
            order = np.argsort(-s, kind="mergesort")
            p, s = p[order], s[order]
            scores[c].append(s)
            ious = _iou(p, g)
            for ti, t in enumerate(IOU_THRESHOLDS):
                taken = np.zeros(g.shape[0], bool)
                tp = np.zeros(p.shape[0], bool)
                for i in range(p.shape[0]):
                    if not g.shape[0]:
                        break
                    cand_iou = np.where(taken, -1.0, ious[i])
                    j = int(np.argmax(cand_iou))
                    if cand_iou[j] >= t:
                        taken[j] = True
                        tp[i] = True
                flags[c][ti].append(tp)
    for c in classes:
        s = np.concatenate(scores[c]) if scores[c] else np.zeros(0, np.float32)
        aps = [_ap(np.concatenate(f) if f else np.zeros(0, bool), s, n_gt[c]) for f in flags[c]]
        per_class[c] = float(np.mean(aps))
        per_class50[c] = aps[0]
    if not classes:
        # Nothing to find: perfect if the candidate finds nothing either.
        value = 1.0 if n_pred == 0 else 0.0
        return MapResult(value, value, {}, 0, n_pred)
    return MapResult(
        float(np.mean(list(per_class.values()))), float(np.mean(list(per_class50.values()))),
        per_class, sum(n_gt.values()), n_pred, dict(n_gt),
    )


def feature_axis(shape: Sequence[int]) -> int:
    """The axis that indexes features (box coordinates, class scores): the smallest non-batch axis."""
    if len(shape) < 2:
        return 0
    dims = list(shape[1:])
    return 1 + dims.index(min(dims))


def normalized_error(ref: np.ndarray, cand: np.ndarray) -> float:
    """Mean over features of MSE / variance of the reference: 0 is identical, 1 is noise-level.

    Per feature, because a detector's output mixes pixel coordinates (hundreds) with scores (0..1).
    """
    r = np.asarray(ref, np.float64)
    c = np.asarray(cand, np.float64)
    if r.ndim < 2:
        var = float(r.var()) or 1.0
        return float(np.mean((r - c) ** 2) / var)
    axis = feature_axis(r.shape)
    r2 = np.moveaxis(r, axis, 0).reshape(r.shape[axis], -1)
    c2 = np.moveaxis(c, axis, 0).reshape(r.shape[axis], -1)
    var = r2.var(axis=1)
    mse = ((r2 - c2) ** 2).mean(axis=1)
    ok = var > 1e-12
    if not ok.any():
        return float(mse.mean())
    return float(np.mean(mse[ok] / var[ok]))


@dataclass
class OutputErrors:
    """Running error statistics of one output tensor (candidate vs reference)."""

    name: str
    count: int = 0
    max_abs: float = 0.0
    sum_abs: float = 0.0
    elements: int = 0
    sum_sq_err: float = 0.0
    sum_sq_ref: float = 0.0
    normalized: list[float] = field(default_factory=list)

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        r = np.asarray(ref, np.float64)
        d = np.asarray(cand, np.float64) - r
        finite = np.isfinite(d)
        d = np.where(finite, d, 0.0)
        self.count += 1
        self.max_abs = max(self.max_abs, float(np.abs(d).max()) if d.size else 0.0)
        self.sum_abs += float(np.abs(d).sum())
        self.elements += int(d.size)
        self.sum_sq_err += float((d * d).sum())
        self.sum_sq_ref += float((np.where(finite, r, 0.0) ** 2).sum())
        self.normalized.append(normalized_error(ref, cand))

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.name, "frames": self.count,
            "max_abs_error": round(self.max_abs, 6),
            "mean_abs_error": round(self.sum_abs / max(self.elements, 1), 6),
            "relative_l2": round(math.sqrt(self.sum_sq_err / self.sum_sq_ref), 6) if self.sum_sq_ref else None,
            "normalized_mse": round(float(np.mean(self.normalized)), 6) if self.normalized else None,
        }


def output_errors(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                  stats: dict[str, OutputErrors]) -> None:
    for name, ref in reference.items():
        if name in candidate:
            stats.setdefault(name, OutputErrors(name)).update(ref, candidate[name])
