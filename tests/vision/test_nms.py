"""NMS against a plain per-class greedy reference, and its edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from edgert.vision.nms import iou_matrix, nms, nms_batched, nms_indices, nms_indices_numpy, nms_indices_opencv

IMPLS = [nms_indices_numpy]
try:
    import cv2  # noqa: F401

    IMPLS.append(nms_indices_opencv)
except ImportError:  # numpy alone: the OpenCV path is not there to test
    pass


def iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def reference_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray | None, thr: float) -> list[int]:
    """Textbook greedy NMS, one box at a time, per class."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    box = boxes.astype(np.float64).tolist()
    keep: list[int] = []
    for i in order:
        ok = True
        for j in keep:
            if classes is not None and classes[i] != classes[j]:
                continue
            if iou(box[i], box[j]) > thr:
                ok = False
                break
        if ok:
            keep.append(i)
    return keep


def random_boxes(rng: np.random.Generator, n: int) -> np.ndarray:
    xy = rng.uniform(0, 200, (n, 2))
    wh = rng.uniform(5, 60, (n, 2))
    return np.concatenate([xy, xy + wh], axis=1).astype(np.float32)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("thr", [0.3, 0.5, 0.7])
def test_matches_reference(impl, seed: int, thr: float) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    n = 150
    boxes = random_boxes(rng, n) - 20  # some negative coordinates, as real models give at the edges
    scores = rng.uniform(0.1, 1.0, n).astype(np.float32)
    classes = rng.integers(0, 3, n).astype(np.int32)
    assert impl(boxes, scores, thr, classes, 1000).tolist() == reference_nms(boxes, scores, classes, thr)
    assert impl(boxes, scores, thr, None, 1000).tolist() == reference_nms(boxes, scores, None, thr)
    assert impl(boxes, scores, thr, classes, 5).tolist() == reference_nms(boxes, scores, classes, thr)[:5]


def test_default_is_class_aware() -> None:
    rng = np.random.default_rng(7)
    boxes = random_boxes(rng, 60)
    scores = rng.uniform(0.1, 1.0, 60).astype(np.float32)
    classes = rng.integers(0, 3, 60).astype(np.int32)
    assert nms(boxes, scores, classes, 0.5).tolist() == reference_nms(boxes, scores, classes, 0.5)


def test_class_aware_keeps_overlapping_boxes_of_other_classes() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10]], np.float32)
    scores = np.array([0.9, 0.8, 0.7], np.float32)
    classes = np.array([0, 0, 1], np.int32)
    assert nms(boxes, scores, classes, 0.5).tolist() == [0, 2]
    assert nms(boxes, scores, classes, 0.5, agnostic=True).tolist() == [0]


@pytest.mark.parametrize("impl", IMPLS)
def test_max_det_and_empty(impl) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    boxes = random_boxes(rng, 50) + np.arange(50, dtype=np.float32)[:, None] * 1000  # no overlaps at all
    scores = rng.uniform(0, 1, 50).astype(np.float32)
    got = impl(boxes, scores, 0.5, None, 7)
    assert got.tolist() == np.argsort(-scores, kind="stable")[:7].tolist()
    assert impl(np.zeros((0, 4), np.float32), np.zeros((0,), np.float32), 0.5).shape == (0,)


@pytest.mark.parametrize("impl", IMPLS)
def test_degenerate_boxes_do_not_break(impl) -> None:  # type: ignore[no-untyped-def]
    boxes = np.array([[5, 5, 5, 5], [5, 5, 5, 5], [0, 0, 4, 4]], np.float32)  # zero-area twins
    scores = np.array([0.9, 0.8, 0.7], np.float32)
    # whether identical empty boxes count as duplicates differs (OpenCV: yes); neither may hide the real box
    for kept in (impl(boxes, scores, 0.5), nms_indices(boxes, scores, 0.5, np.zeros(3, np.int32))):
        assert kept.tolist() in ([0, 1, 2], [0, 2])


def test_iou_matrix() -> None:
    iou = iou_matrix([[0, 0, 10, 10]], [[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]])
    np.testing.assert_allclose(iou, [[1.0, 1 / 3, 0.0]])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agnostic", [False, True])
def test_batched_equals_one_call_per_image(seed: int, agnostic: bool) -> None:
    """One NMS call over 8 images' candidates keeps, per image, exactly what a call on that image alone keeps
    (same boxes, same best-first order), with max_det counted per image; the images' boxes overlap in
    pixels (the same region of 8 frames) and must still never suppress each other."""
    rng = np.random.default_rng(seed)
    per = [int(rng.integers(0, 120)) for _ in range(8)]
    boxes = [random_boxes(rng, n) for n in per]
    scores = [rng.uniform(0.1, 1.0, n).astype(np.float32) for n in per]
    classes = [rng.integers(0, 80, n).astype(np.int32) for n in per]
    all_boxes, all_scores, all_classes = np.concatenate(boxes), np.concatenate(scores), np.concatenate(classes)
    sample = np.repeat(np.arange(8), per)
    for max_det in (1000, 7):
        got = nms_batched(all_boxes, all_scores, 0.5, None if agnostic else all_classes, sample, 80, max_det)
        starts = np.concatenate([[0], np.cumsum(per)])
        for k in range(8):
            mine = [int(i) - int(starts[k]) for i in got if sample[i] == k]
            want = reference_nms(boxes[k], scores[k], None if agnostic else classes[k], 0.5)[:max_det]
            assert mine == want
