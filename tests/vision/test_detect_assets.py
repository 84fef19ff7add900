"""The real detection models on real images and video: boxes land where the objects are.

Regions below were measured by hand on images/bus.jpg (810 x 1080) with a 50-pixel grid drawn over it,
as (x1, y1, x2, y2) in original pixels.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgert.vision.detections import Detections
from edgert.vision.detector import Detector
from edgert.vision.nms import iou_matrix

cv2 = pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

BUS = (15, 228, 805, 735)  # roof edge to wheel bottoms, left bumper to right edge of the frame
PEOPLE = {
    "beige coat, left": (48, 398, 245, 905),
    "black coat, centre": (220, 400, 348, 862),
    "walking out, right edge": (665, 400, 810, 885),
    "cut off, left edge": (0, 550, 80, 880),
}
MAIN_PEOPLE = ("beige coat, left", "black coat, centre")


def model_path(assets: Path, name: str) -> Path:
    return assets / "models" / "detection" / name


@pytest.fixture(scope="module")
def bus(assets: Path) -> np.ndarray:
    img = cv2.imread(str(assets / "images" / "bus.jpg"))
    assert img is not None and img.shape == (1080, 810, 3)
    return img


@pytest.fixture(scope="module")
def vtest_frames(assets: Path) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(assets / "video" / "vtest.avi"))
    frames = []
    for _ in range(30):
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    assert len(frames) == 30
    return frames


def inside(point: tuple[float, float], region: tuple[int, int, int, int]) -> bool:
    return region[0] <= point[0] <= region[2] and region[1] <= point[1] <= region[3]


def centres(det: Detections) -> list[tuple[float, float]]:
    return [((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in det.xyxy.tolist()]


def check_people(det: Detections, person: str) -> None:
    people = det[det.class_id == det.names.index(person)]
    assert len(people) >= 2, det
    for centre, box in zip(centres(people), people.xyxy):
        where = [name for name, region in PEOPLE.items() if inside(centre, region)]
        assert where, f"{person} box {box.tolist()} is on nobody"
    for name in MAIN_PEOPLE:
        region = PEOPLE[name]
        best = iou_matrix(np.array([region]), people.xyxy).max()
        assert best >= 0.6, f"{name}: best IoU {best:.2f} with {people.xyxy.round().tolist()}"


# model file and the decoder auto-pick must choose for it
COCO_MODELS = {"yolov3-tiny-coco-416.onnx": "yolov5", "nanodet-m-416-coco-v8layout.onnx": "yolov8"}


@pytest.fixture(scope="module", params=sorted(COCO_MODELS))
def coco_detector(request: pytest.FixtureRequest, assets: Path) -> Iterator[Detector]:
    with Detector(model_path(assets, request.param)) as det:
        assert det.decoder.kind == COCO_MODELS[request.param]
        yield det


def test_coco_models_on_bus(coco_detector: Detector, bus: np.ndarray) -> None:
    det = coco_detector(bus)
    assert det.names[0] == "person" and det.names[5] == "bus"
    buses = det[det.class_id == 5]
    assert len(buses) >= 1, det
    iou = iou_matrix(np.array([BUS]), buses.xyxy[:1])[0, 0]
    assert iou >= 0.75, f"bus box {buses.xyxy[0].round().tolist()} vs measured {BUS}: IoU {iou:.2f}"
    check_people(det, "person")
    # every box is inside the frame
    assert (det.xyxy >= 0).all() and (det.xyxy[:, 2] <= 810).all() and (det.xyxy[:, 3] <= 1080).all()


def test_coco_models_find_pedestrians_in_most_video_frames(
    coco_detector: Detector, vtest_frames: list[np.ndarray]
) -> None:
    with_people = 0
    for frame in vtest_frames:
        det = coco_detector(frame)
        people = det[det.class_id == 0]
        with_people += len(people) > 0
        # pedestrians are upright: taller than wide, and smaller than the frame
        if len(people):
            w = people.xyxy[:, 2] - people.xyxy[:, 0]
            h = people.xyxy[:, 3] - people.xyxy[:, 1]
            assert np.median(h / np.maximum(w, 1)) > 1.3
    assert with_people >= 0.8 * len(vtest_frames), f"persons in {with_people}/{len(vtest_frames)} frames"


def test_ultralytics_export_decodes_with_its_own_names(assets: Path, bus: np.ndarray) -> None:
    """yolov8s-fall-640: no decoder named, names and size from its metadata."""
    with Detector(model_path(assets, "yolov8s-fall-640.onnx")) as detector:
        assert detector.decoder.kind == "yolov8"
        assert detector.names == ("Normal", "Fall")
        assert detector.preprocessor.input_shape == (1, 3, 640, 640)
        det = detector(bus)
    assert set(det.class_names()) == {"Normal"}, det  # standing people
    check_people(det, "Normal")


def test_ultralytics_export_on_video(assets: Path, vtest_frames: list[np.ndarray]) -> None:
    """The fall model (640 input, slow here) on a few vtest frames: walking people are "Normal"."""
    with Detector(model_path(assets, "yolov8s-fall-640.onnx")) as detector:
        results = [detector(frame) for frame in vtest_frames[::10]]
    assert all(set(r.class_names()) <= {"Normal", "Fall"} for r in results)
    assert sum("Normal" in r.class_names() for r in results) >= 2, results
