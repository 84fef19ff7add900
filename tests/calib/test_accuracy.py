"""COCO-style mAP of candidate detections against reference detections."""

from __future__ import annotations

import numpy as np
import pytest

from edgert.calib.accuracy import _ap, detection_map, normalized_error
from edgert.vision.detections import Detections


def _det(boxes: list[list[float]], scores: list[float], classes: list[int]) -> Detections:
    return Detections(np.array(boxes, np.float32).reshape(-1, 4), np.array(scores), np.array(classes))


def test_identical_detections_score_one() -> None:
    ref = [_det([[0, 0, 10, 10], [20, 20, 40, 50]], [0.9, 0.8], [0, 1])]
    r = detection_map(ref, ref)
    assert r.map50_95 == pytest.approx(1.0) and r.map50 == pytest.approx(1.0)


def test_shifted_box_passes_low_iou_thresholds_only() -> None:
    ref = [_det([[0, 0, 100, 100]], [0.9], [0])]
    cand = [_det([[0, 0, 100, 80]], [0.9], [0])]  # IoU 0.8: matched at 0.50..0.80 (7 of 10 thresholds)
    r = detection_map(ref, cand)
    assert r.map50 == pytest.approx(1.0)
    assert r.map50_95 == pytest.approx(0.7)


def test_classes_are_averaged_and_missing_boxes_cost_recall() -> None:
    ref = [_det([[0, 0, 10, 10], [50, 50, 60, 60], [0, 0, 30, 30]], [0.9, 0.9, 0.9], [0, 0, 1])]
    cand = [_det([[0, 0, 10, 10], [0, 0, 30, 30]], [0.9, 0.9], [0, 1])]  # one class-0 box missed
    r = detection_map(ref, cand)
    # class 0: recall tops at 0.5 with precision 1 -> 51 of 101 recall points; class 1: 1.0
    assert r.per_class[0] == pytest.approx(51 / 101)
    assert r.per_class[1] == pytest.approx(1.0)
    assert r.map50_95 == pytest.approx((51 / 101 + 1) / 2)


def test_false_positive_ranked_first_lowers_precision() -> None:
    tp = np.array([False, True])
    scores = np.array([0.9, 0.8])
    # precision at recall 1.0 is 0.5 and the envelope is 0.5 everywhere
    assert _ap(tp, scores, 1) == pytest.approx(0.5)
    assert _ap(tp[::-1], scores, 1) == pytest.approx(1.0)


def test_low_scores_filtered_for_the_strict_figure() -> None:
    ref = [_det([[0, 0, 10, 10]], [0.9], [0])]
    cand = [_det([[0, 0, 10, 10]], [0.2], [0])]
    assert detection_map(ref, cand).map50_95 == pytest.approx(1.0)
    assert detection_map(ref, cand, min_score=0.25).map50_95 == 0.0


def test_empty_frames() -> None:
    empty = [Detections.empty()]
    assert detection_map(empty, empty).map50_95 == 1.0
    assert detection_map(empty, [_det([[0, 0, 1, 1]], [0.5], [0])]).map50_95 == 0.0


def test_normalized_error_is_per_feature() -> None:
    rng = np.random.default_rng(0)
    ref = np.concatenate([rng.uniform(0, 400, (1, 4, 100)), rng.uniform(0, 1, (1, 80, 100))], axis=1)
    cand = ref.copy()
    cand[:, 4:] += 0.1  # score error: invisible in absolute terms next to pixel coordinates
    assert normalized_error(ref, ref) == 0.0
    assert normalized_error(ref, cand) > 0.05
