"""Class-aware non-maximum suppression: OpenCV's ``cv2.dnn.NMSBoxes`` when OpenCV is there, else numpy.

Class awareness uses the offset trick: every class's boxes are shifted by ``class_id * span`` so boxes
of different classes never overlap, and one greedy pass handles all classes (``NMSBoxesBatched`` does the
same inside; ``NMSBoxes`` plus the offset also works on OpenCV 4.5, JetPack 5's). On the real candidates
of nanodet and yolov3-tiny (docs/results/README.md) OpenCV returns the same boxes 7-20x faster than
the numpy loop, which stays as the fallback: each of its greedy steps is one vectorised IoU of the best
remaining box against the rest, so its Python loop runs once per *kept* box, not once per candidate.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from edgert._lazy import lazy_import
from edgert.errors import BackendUnavailable

__all__ = ["iou_matrix", "nms", "nms_batched", "nms_indices", "nms_indices_numpy", "nms_indices_opencv"]

#: Candidates beyond this many (highest scores first) are dropped before NMS, as Ultralytics does.
MAX_CANDIDATES = 30000


_CV2: ModuleType | bool | None = False  # False: not looked up yet; None: not installed


def _cv2() -> ModuleType | None:
    global _CV2
    if _CV2 is False:
        try:
            _CV2 = lazy_import("cv2")
        except BackendUnavailable:
            _CV2 = None
        if _CV2 is not None and not hasattr(_CV2, "dnn"):
            _CV2 = None
    return _CV2 if isinstance(_CV2, ModuleType) else None


def _ordered(xyxy: np.ndarray, scores: np.ndarray, group: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Candidates best first (at most MAX_CANDIDATES), with boxes offset per group, in float64.

    float64 because the offsets grow with the group id (class, or sample x class in a batch): at an offset of
    ~10^6 px float32 would keep 1/16 px of a box's position, float64 keeps it exactly enough.
    """
    order = np.argsort(-scores, kind="stable")
    if order.shape[0] > MAX_CANDIDATES:
        order = order[:MAX_CANDIDATES]
    boxes = xyxy[order].astype(np.float64)
    if group is not None and order.shape[0] > 1:
        span = float(max(np.abs(boxes).max(), 0.0)) * 2.0 + 1.0
        boxes += (group[order].astype(np.float64) * span)[:, None]
    return order, boxes


def nms_indices(
    xyxy: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    class_id: np.ndarray | None = None,
    max_det: int = 300,
) -> np.ndarray:
    """Indices of the boxes kept, best score first (OpenCV when installed, else numpy).

    ``xyxy`` (N, 4), ``scores`` (N,); with ``class_id`` boxes only suppress boxes of their own class.
    A box is suppressed by a better one of its class when their IoU exceeds ``iou_threshold``.
    """
    if _cv2() is not None:
        return nms_indices_opencv(xyxy, scores, iou_threshold, class_id, max_det)
    return nms_indices_numpy(xyxy, scores, iou_threshold, class_id, max_det)


def nms_indices_opencv(
    xyxy: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    class_id: np.ndarray | None = None,
    max_det: int = 300,
) -> np.ndarray:
    """:func:`nms_indices` by ``cv2.dnn.NMSBoxes`` on class-offset boxes."""
    cv2 = _cv2()
    if cv2 is None:
        raise BackendUnavailable("OpenCV is not installed: use nms_indices_numpy")
    if scores.shape[0] == 0:
        return np.zeros((0,), np.intp)
    order, boxes = _ordered(xyxy, scores, class_id)
    xywh = np.empty(boxes.shape, np.float64)  # Rect2d: x, y, width, height (float64, like the offsets)
    xywh[:, :2] = boxes[:, :2]
    np.subtract(boxes[:, 2:], boxes[:, :2], out=xywh[:, 2:])
    # OpenCV gets ranks, not scores: boxes are already best first, ranks are positive (it keeps
    # score > threshold >= 0; thresholds were the decoder's job) and ties break as in the numpy path.
    ranks = np.arange(order.shape[0], 0, -1, dtype=np.float32)
    kept = np.asarray(cv2.dnn.NMSBoxes(xywh, ranks, 0.0, float(iou_threshold)), np.intp).reshape(-1)
    kept.sort()  # positions in `order`: ascending is best first
    result: np.ndarray = order[kept[:max_det]]
    return result


def nms_indices_numpy(
    xyxy: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    class_id: np.ndarray | None = None,
    max_det: int = 300,
) -> np.ndarray:
    """:func:`nms_indices` in numpy: one vectorised IoU per kept box."""
    if scores.shape[0] == 0:
        return np.zeros((0,), np.intp)
    order, boxes = _ordered(xyxy, scores, class_id)
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


def nms_batched(
    xyxy: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    class_id: np.ndarray | None,
    sample: np.ndarray,
    num_classes: int,
    max_det: int = 300,
) -> np.ndarray:
    """:func:`nms_indices` for the candidates of several images at once: indices kept, best score first.

    ``sample`` (N,) says which image each box belongs to; boxes only suppress boxes of their own image (and
    class, unless ``class_id`` is None), and ``max_det`` applies per image. One call for a whole batch: the
    per-image results are those of one call per image (boxes of different groups never overlap once offset,
    and the order within an image is the same stable best-first order), at one call's host cost.
    ``num_classes`` bounds ``class_id`` (group = sample x num_classes + class).
    """
    if scores.shape[0] == 0:
        return np.zeros((0,), np.intp)
    sample = np.asarray(sample, np.int64)
    group = sample if class_id is None else sample * max(int(num_classes), 1) + np.asarray(class_id, np.int64)
    kept = nms_indices(xyxy, scores, iou_threshold, group, max(1, scores.shape[0]))
    if kept.shape[0] <= max_det:
        return kept
    # max_det per image: rank of each kept box within its image (kept is best first)
    owner = sample[kept]
    by_owner = np.argsort(owner, kind="stable")
    sorted_owner = owner[by_owner]
    starts = np.searchsorted(sorted_owner, sorted_owner, side="left")
    rank = np.empty(kept.shape[0], np.intp)
    rank[by_owner] = np.arange(kept.shape[0]) - starts
    result: np.ndarray = kept[rank < max_det]
    return result


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
