"""Decoder choice from output shapes and metadata, and each decoder on hand-built outputs."""

from __future__ import annotations

import numpy as np
import pytest

from edgert.coco import COCO_NAMES
from edgert.config import DecodeConfig
from edgert.errors import InputError, ModelError
from edgert.types import TensorSpec
from edgert.vision.decoders import make_decoder, parse_names
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform

F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)
# a 200x100 (w x h) frame letterboxed into 100x100: scale 0.5, 25 px bars top and bottom
TR = LetterboxTransform(scale_x=0.5, scale_y=0.5, pad_x=0.0, pad_y=25.0, src_width=200, src_height=100)
ULTRA = {"names": "{0: 'Normal', 1: 'Fall'}", "imgsz": "[640, 640]", "stride": "32", "task": "detect"}


def specs(*shapes: tuple, names: tuple[str, ...] | None = None, dtypes: tuple | None = None) -> list[TensorSpec]:
    names = names or tuple(f"out{i}" for i in range(len(shapes)))
    dtypes = dtypes or (F32,) * len(shapes)
    return [TensorSpec(n, tuple(s), np.dtype(d)) for n, s, d in zip(names, shapes, dtypes)]


@pytest.mark.parametrize(
    ("shapes", "metadata", "kind", "n_names"),
    [
        ([(1, 84, 8400)], {}, "yolov8", 80),
        ([(1, 6, 8400)], ULTRA, "yolov8", 2),
        ([(1, 84, "anchors")], {}, "yolov8", 80),
        ([(1, 25200, 85)], {}, "yolov5", 80),
        ([(1, 2535, 85), (1, 3, 13, 13, 85)], {}, "yolov5", 80),  # extra raw head outputs beside the real one
        ([(1, 25200, 6)], {}, "yolov5", 1),  # one class with objectness: too many rows for end to end
        ([(1, 300, 6)], {}, "end2end", 0),
        ([(1, "n", 6)], {}, "end2end", 0),
        ([(1, 300, 6)], ULTRA, "end2end", 2),
        ([(1, 1), (1, 100, 4), (1, 100), (1, 100)], {}, "efficient_nms", 0),
    ],
)
def test_auto_pick(shapes: list, metadata: dict, kind: str, n_names: int) -> None:
    decoder = make_decoder(DecodeConfig(), specs(*shapes), metadata)
    assert decoder.kind == kind
    assert len(decoder.names) == n_names
    if n_names == 80:
        assert decoder.names == COCO_NAMES
    if metadata is ULTRA:
        assert decoder.names == ("Normal", "Fall")


def test_names_precedence() -> None:
    out = specs((1, 6, 8400))
    assert make_decoder(DecodeConfig(names=("a", "b")), out, ULTRA).names == ("a", "b")
    assert make_decoder(DecodeConfig(), out, {}).names == ("class0", "class1")
    assert parse_names("{0: 'x', 2: 'z'}") == ("x", "class1", "z")
    assert parse_names("['p', 'q']") == ("p", "q")
    assert parse_names("not python") is None
    assert parse_names("{'a': 'b'}") is None


@pytest.mark.parametrize(
    "shapes",
    [
        [(1, 3, 8, 8)],
        [(1, 4, 100)],  # yolov8 with no classes
        [(1, 100, 5)],  # yolov5 with no classes
        [(1, 10, 10)],
        [(1, 84, 8400), (1, 25200, 85)],  # two candidates: ambiguous
    ],
)
def test_no_match_is_one_line_model_error(shapes: list) -> None:
    with pytest.raises(ModelError) as info:
        make_decoder(DecodeConfig(), specs(*shapes), {})
    msg = str(info.value)
    assert "\n" not in msg
    assert all(k in msg for k in ("yolov5", "yolov8", "end2end", "efficient_nms"))
    assert "[" in msg and "float32" in msg  # names the output shapes


def test_forced_kind_must_fit() -> None:
    with pytest.raises(ModelError, match="end2end needs"):
        make_decoder(DecodeConfig(kind="end2end"), specs((1, 84, 8400)), {})
    with pytest.raises(ModelError, match="efficient_nms needs"):
        make_decoder(DecodeConfig(kind="efficient_nms"), specs((1, 84, 8400)), {})
    # a forced kind wins over the guess: [1,300,6] read as YOLOv5 with one class
    assert make_decoder(DecodeConfig(kind="yolov5"), specs((1, 300, 6)), {}).kind == "yolov5"


def test_non_detect_ultralytics_model_is_refused() -> None:
    with pytest.raises(ModelError, match="'pose' model"):
        make_decoder(DecodeConfig(), specs((1, 56, 8400)), {"task": "pose"})


def yolov8_output(n: int, c: int, rows: list[tuple[float, float, float, float, int, float]]) -> np.ndarray:
    out = np.zeros((1, 4 + c, n), np.float32)
    out[0, 4:] = 0.01  # background score everywhere
    for i, (cx, cy, w, h, cls, score) in enumerate(rows):
        out[0, :4, i] = (cx, cy, w, h)
        out[0, 4 + cls, i] = score
    return out


def test_yolov8_decodes_and_maps_back() -> None:
    rows = [
        (50, 50, 20, 10, 1, 0.9),  # -> input box 40,45,60,55 -> frame 80,40,120,60
        (51, 50, 20, 10, 1, 0.8),  # overlaps the first, same class: suppressed
        (51, 50, 20, 10, 2, 0.7),  # same place, other class: kept
        (10, 30, 4, 4, 0, 0.2),  # below conf
    ]
    dec = make_decoder(DecodeConfig(conf=0.25, iou=0.45), specs((1, 7, 100)), {})
    det = dec({"out0": yolov8_output(100, 3, rows)}, TR)
    assert isinstance(det, Detections)
    assert det.class_id.tolist() == [1, 2]
    np.testing.assert_allclose(det.confidence, [0.9, 0.7])
    np.testing.assert_allclose(det.xyxy[0], [80, 40, 120, 60], atol=1e-4)
    assert det.class_names() == ["class1", "class2"]
    # the session's output buffer is reused by the next infer: detections must not alias it
    out = yolov8_output(100, 3, rows)
    det = dec({"out0": out}, TR)
    out[:] = 0
    assert det.confidence[0] == pytest.approx(0.9)


def test_yolov8_class_filter_agnostic_and_max_det() -> None:
    rows = [(50, 50, 20, 10, 1, 0.9), (51, 50, 20, 10, 2, 0.7), (10, 80, 8, 8, 0, 0.6)]
    out = {"out0": yolov8_output(50, 3, rows)}
    dec = make_decoder(DecodeConfig(classes=(2, 0)), specs((1, 7, 50)), {})
    assert sorted(dec(out, TR).class_id.tolist()) == [0, 2]
    dec = make_decoder(DecodeConfig(agnostic=True), specs((1, 7, 50)), {})
    assert dec(out, TR).class_id.tolist() == [1, 0]
    dec = make_decoder(DecodeConfig(max_det=1), specs((1, 7, 50)), {})
    assert len(dec(out, TR)) == 1
    dec = make_decoder(DecodeConfig(conf=0.95), specs((1, 7, 50)), {})
    assert len(dec(out, TR)) == 0 and dec(out, TR).names == ("class0", "class1", "class2")


def test_yolov5_objectness_times_class() -> None:
    out = np.zeros((1, 30, 5 + 3), np.float32)
    out[0, 0] = (50, 50, 20, 10, 0.9, 0.1, 0.9, 0.2)  # score 0.81, class 1
    out[0, 1] = (20, 40, 10, 10, 0.5, 0.4, 0.1, 0.3)  # score 0.2: below 0.25 although objectness passes
    out[0, 2] = (80, 60, 10, 20, 0.2, 1.0, 0.0, 0.0)  # objectness below conf
    dec = make_decoder(DecodeConfig(), specs((1, 30, 8)), {})
    assert dec.kind == "yolov5"
    det = dec({"out0": out}, TR)
    assert det.class_id.tolist() == [1]
    np.testing.assert_allclose(det.confidence, [0.81], rtol=1e-5)
    np.testing.assert_allclose(det.xyxy[0], [80, 40, 120, 60], atol=1e-4)


def test_end2end_keeps_model_nms() -> None:
    out = np.zeros((1, 300, 6), np.float32)
    out[0, 0] = (40, 45, 60, 55, 0.9, 3)
    out[0, 1] = (41, 45, 60, 55, 0.8, 3)  # overlapping, kept: the model already ran NMS
    out[0, 2] = (0, 0, 10, 10, 0.1, 1)
    dec = make_decoder(DecodeConfig(names=tuple("abcd")), specs((1, 300, 6)), {})
    det = dec({"out0": out}, TR)
    assert det.class_names() == ["d", "d"]
    np.testing.assert_allclose(det.xyxy[0], [80, 40, 120, 60], atol=1e-4)


def test_efficient_nms_uses_num_dets_and_roles_by_name() -> None:
    names = ("num_dets", "det_boxes", "det_scores", "det_classes")
    shapes = [(1, 1), (1, 20, 4), (1, 20), (1, 20)]
    # classes listed before scores, both int/float as the plugin gives: roles come from the names
    order = [0, 1, 3, 2]
    dec = make_decoder(
        DecodeConfig(),
        specs(*[shapes[i] for i in order], names=tuple(names[i] for i in order), dtypes=(I32, F32, I32, F32)),
        {},
    )
    assert dec.kind == "efficient_nms"
    boxes = np.zeros((1, 20, 4), np.float32)
    boxes[0, 0] = (40, 45, 60, 55)
    boxes[0, 1] = (0, 25, 100, 75)
    boxes[0, 2] = (1, 1, 2, 2)  # beyond num_dets: ignored although its score is high
    scores = np.zeros((1, 20), np.float32)
    scores[0, :3] = (0.9, 0.6, 0.99)
    classes = np.zeros((1, 20), np.int32)
    classes[0, :3] = (5, 0, 7)
    det = dec(
        {"num_dets": np.array([[2]], np.int32), "det_boxes": boxes, "det_scores": scores, "det_classes": classes}, TR
    )
    assert det.class_id.tolist() == [5, 0]
    np.testing.assert_allclose(det.xyxy, [[80, 40, 120, 60], [0, 0, 200, 100]], atol=1e-4)


def test_missing_output_is_model_error() -> None:
    dec = make_decoder(DecodeConfig(), specs((1, 84, 8400)), {})
    with pytest.raises(ModelError, match="out0 is missing"):
        dec({"other": np.zeros((1, 84, 8400), np.float32)}, TR)


def test_detections_validation_and_records() -> None:
    det = Detections([[1.234, 2, 3, 4]], [0.98767], [np.int64(2)], ("a", "b"))
    assert det.xyxy.dtype == np.float32 and det.class_id.dtype == np.int32
    assert det.to_records() == [{"box": [1.2, 2.0, 3.0, 4.0], "confidence": 0.9877, "class_id": 2, "class_name": "2"}]
    assert len(Detections.empty()) == 0 and Detections.empty().xyxy.shape == (0, 4)
    assert det == Detections(det.xyxy.copy(), det.confidence.copy(), det.class_id.copy(), ("a", "b"))
    assert det != det[det.confidence > 0.99] and det != Detections.empty(("a", "b"))
    assert len(det[det.confidence > 0.99]) == 0
    with pytest.raises(InputError, match=r"expected \(N, 4\)"):
        Detections(np.zeros((2, 3)), np.zeros(2), np.zeros(2))
    with pytest.raises(InputError, match="2 boxes but 1 confidences"):
        Detections(np.zeros((2, 4)), np.zeros(1), np.zeros(2))
    with pytest.raises(InputError, match="expected numbers"):
        Detections(np.zeros((1, 4)), ["high"], [0])


def test_yolov8_decode_makes_no_large_temporaries() -> None:
    """[1,84,8400]: the class max goes into a scratch made once; only candidates are copied."""
    import tracemalloc

    rng = np.random.default_rng(0)
    out = yolov8_output(8400, 80, [(100 + 3 * i, 200, 20, 40, i % 80, 0.9) for i in range(20)])
    out[0, 4:] = rng.uniform(0, 0.2, (80, 8400)).astype(np.float32)
    for i in range(20):
        out[0, 4 + i % 80, i] = 0.9
    dec = make_decoder(DecodeConfig(), specs((1, 84, 8400)), {})
    tr = LetterboxTransform(1.0, 1.0, 0.0, 0.0, 640, 640)
    assert len(dec({"out0": out}, tr)) > 0
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(10):
            det = dec({"out0": out}, tr)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(det) == 20
    # the output is 2.7 MB; a per-anchor temporary would be 33 KB (float32) and a full copy 2.7 MB
    assert peak - before < 24 * 1024, f"peak {peak - before} bytes"
