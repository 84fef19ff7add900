"""Class-aware non-maximum suppression in numpy.

Class awareness uses the offset trick: every class's boxes are shifted by ``class_id * span`` so boxes
of different classes never overlap, and one greedy pass handles all classes. Each greedy step is one
vectorised IoU of the best remaining box against the rest, so the Python loop runs once per *kept* box
(bounded by ``max_det``), not once per candidate.
"""

from __future__ import annotations

import numpy as np

__all__ = ["iou_matrix", "nms", "nms_indices"]

#: Candidates beyond this many (highest scores first) are dropped before NMS, as Ultralytics does.
MAX_CANDIDATES = 30000


def nms_indices(
    xyxy: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    class_id: np.ndarray | None = None,
    max_det: int = 300,
) -> np.ndarray:
    """Indices of the boxes kept, best score first.

    ``xyxy`` (N, 4), ``scores`` (N,); with ``class_id`` boxes only suppress boxes of their own class.
    """
    n = int(scores.shape[0])
    if n == 0:
        return np.zeros((0,), np.intp)
    order = np.argsort(-scores, kind="stable")
    if n > MAX_CANDIDATES:
        order = order[:MAX_CANDIDATES]
    boxes = xyxy[order].astype(np.float32, copy=False)
    if class_id is not None and n > 1:
        span = float(max(boxes.max(), 0.0)) + 1.0
        boxes = boxes + (class_id[order].astype(np.float32) * span)[:, None]
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = np.maximum(x2 - x1, 0.0) * np.maximum(y2 - y1, 0.0)
    alive = np.arange(order.shape[0])
    keep: list[int] = []
    while alive.size and len(keep) < max_det:
        i = int(alive[0])
        keep.append(i)
        rest = alive[1:]
        if not rest.size:
            break
        w = np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest])
        h = np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest])
        np.maximum(w, 0.0, out=w)
        np.maximum(h, 0.0, out=h)
        inter = w * h
        union = areas[i] + areas[rest] - inter
        # iou <= thr  <=>  inter <= thr * union (no division, and a zero union keeps the box)
        alive = rest[inter <= iou_threshold * union]
    result: np.ndarray = order[np.asarray(keep, np.intp)]
    return result


def nms(
    xyxy: np.ndarray,
    scores: np.ndarray,
    class_id: np.ndarray,
    iou_threshold: float,
    max_det: int = 300,
    agnostic: bool = False,
) -> np.ndarray:
    """:func:`nms_indices`, class-aware unless ``agnostic``."""
    return nms_indices(xyxy, scores, iou_threshold, None if agnostic else class_id, max_det)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) IoU of two sets of xyxy boxes (for tests and evaluation, not the hot path)."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    out: np.ndarray = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    return out
