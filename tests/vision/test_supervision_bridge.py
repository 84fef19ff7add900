"""Detections to and from supervision (lazy: supervision comes with the trackers extra, not with edgert)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edgert.errors import InputError
from edgert.vision.detections import Detections
from tests.helpers import ROOT

sv = pytest.importorskip("supervision", reason="supervision comes with pip install 'edgert[track]'")

NAMES = ("person", "bicycle", "car")


def _tracked() -> Detections:
    return Detections(np.array([[10.5, 20.25, 110, 220], [300, 40, 360, 100], [0, 0, 5, 5]], np.float32),
                      np.array([0.91, 0.42, 0.3]), np.array([0, 2, 1]), NAMES, track_id=np.array([7, 12, -1]))


def test_round_trip_keeps_boxes_classes_scores_and_track_ids() -> None:
    det = _tracked()
    out = det.to_supervision()
    assert isinstance(out, sv.Detections) and len(out) == 3
    np.testing.assert_array_equal(out.xyxy, det.xyxy)
    np.testing.assert_array_equal(out.confidence, det.confidence)
    assert out.class_id.tolist() == [0, 2, 1] and out.tracker_id.tolist() == [7, 12, -1]
    assert out.data["class_name"].tolist() == ["person", "car", "bicycle"]
    back = Detections.from_supervision(out, NAMES)
    assert back == det and back.track_id is not None and back.track_id.dtype == np.int64
    # supervision's own subsetting and then back: the arrays stay aligned
    assert Detections.from_supervision(out[out.confidence > 0.4], NAMES) == det[det.confidence > 0.4]


def test_untracked_and_empty_and_missing_fields() -> None:
    plain = Detections(np.array([[1, 2, 3, 4]]), np.array([0.5]), np.array([1]), NAMES)
    out = plain.to_supervision()
    assert out.tracker_id is None
    assert Detections.from_supervision(out, NAMES) == plain
    empty = Detections.empty(NAMES)
    assert len(empty.to_supervision()) == 0 and Detections.from_supervision(empty.to_supervision(), NAMES) == empty
    bare = sv.Detections(xyxy=np.array([[0, 0, 10, 10]], np.float32))  # no scores, no classes
    got = Detections.from_supervision(bare)
    assert got.confidence.tolist() == [1.0] and got.class_id.tolist() == [0] and got.track_id is None
    with pytest.raises(InputError, match=r"expected a supervision\.Detections"):
        Detections.from_supervision(object())


def test_supervision_annotators_and_zones_take_the_result() -> None:
    det = _tracked()
    frame = np.zeros((240, 400, 3), np.uint8)
    drawn = sv.BoxAnnotator().annotate(frame.copy(), det.to_supervision())
    assert drawn.any()  # boxes were drawn
    zone = sv.PolygonZone(np.array([[0, 0], [200, 0], [200, 240], [0, 240]]))
    assert zone.trigger(det.to_supervision()).tolist() == [True, False, True]


def test_importing_edgert_does_not_load_supervision() -> None:
    code = ("import sys, edgert, edgert.vision.detections as d; "
            "d.Detections.empty(); print('supervision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
