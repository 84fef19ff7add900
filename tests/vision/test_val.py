"""``edgert val`` through the real CLI on the real NanoDet model: labels made from its own detections."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.vision.validate import canonical_name, class_mapping
from tests.helpers import assert_one_line_error, run_cli

cv2 = pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")
pytest.importorskip("pycocotools")

NANODET = "nanodet-m-416-coco-v8layout.onnx"
IMAGES = ("bus.jpg", "zidane.jpg", "darknet_dog.jpg", "darknet_horses.jpg")
TIMEOUT = 240


@pytest.fixture(scope="module")
def labelled(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A few asset images, and the FP32 model's own detections on them written as COCO and YOLO labels."""
    from edgert.vision.detector import Detector

    root = tmp_path_factory.mktemp("val")
    images = root / "images"
    images.mkdir()
    for name in IMAGES:
        shutil.copy(assets / "images" / name, images / name)
    model = assets / "models" / "detection" / NANODET
    found = {}
    with Detector(model) as det:  # conf 0.25: the confident boxes are the "truth"
        names = det.names
        for name in IMAGES:
            found[name] = det(images / name)
    # Category ids that are not the model's class ids, and COCO's own spellings: matching is by name.
    categories = [{"id": 1000 + 3 * i, "name": canonical_name(n)} for i, n in enumerate(names)]
    coco: dict[str, Any] = {"images": [], "annotations": [], "categories": categories}
    yolo = root / "yolo"
    yolo.mkdir()
    (yolo / "classes.txt").write_text("\n".join(names) + "\n")
    for k, name in enumerate(IMAGES, 1):
        d = found[name]
        h, w = d.image.shape[:2]
        coco["images"].append({"id": k, "file_name": name, "width": w, "height": h})
        rows = []
        for box, cid in zip(d.xyxy.tolist(), d.class_id.tolist()):
            bw, bh = box[2] - box[0], box[3] - box[1]
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": k,
                                        "category_id": 1000 + 3 * cid, "bbox": [box[0], box[1], bw, bh],
                                        "area": bw * bh, "iscrowd": 0})
            rows.append(f"{cid} {(box[0] + bw / 2) / w:.6f} {(box[1] + bh / 2) / h:.6f} {bw / w:.6f} {bh / h:.6f}")
        (yolo / name.replace(".jpg", ".txt")).write_text("\n".join(rows) + "\n")
    (root / "coco.json").write_text(json.dumps(coco))
    classes = {names[c] for d in found.values() for c in d.class_id.tolist()}
    return {"root": root, "images": images, "model": model, "coco": coco, "yolo": yolo, "classes": classes,
            "boxes": sum(len(d) for d in found.values())}


def _val(labelled: dict[str, Any], labels: Path, *extra: str) -> dict[str, Any]:
    r = run_cli("val", str(labelled["model"]), "--images", str(labelled["images"]), "--labels", str(labels),
                "--json", *extra, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_same_model_scores_one_against_its_own_coco_labels(labelled: dict[str, Any]) -> None:
    preds = labelled["root"] / "preds.json"
    result = _val(labelled, labelled["root"] / "coco.json", "--save-json", str(preds))
    assert result["map50"] == pytest.approx(1.0, abs=1e-6) and result["map50_95"] == pytest.approx(1.0, abs=1e-6)
    assert result["images"] == len(IMAGES) and result["instances"] == labelled["boxes"]
    scored = {name for name, c in result["per_class"].items() if c["instances"]}
    assert scored == {canonical_name(n) for n in labelled["classes"]}
    assert all(result["per_class"][n]["ap50_95"] == pytest.approx(1.0, abs=1e-6) for n in scored)
    saved = json.loads(preds.read_text())  # COCO results: the label file's image and category ids
    assert {p["image_id"] for p in saved} == {im["id"] for im in labelled["coco"]["images"]}
    assert {p["category_id"] for p in saved} <= {c["id"] for c in labelled["coco"]["categories"]}
    assert len(saved) >= labelled["boxes"]
    assert all(len(p["bbox"]) == 4 and 0 < p["score"] <= 1 for p in saved)


def test_yolo_txt_labels_give_the_same_answer(labelled: dict[str, Any]) -> None:
    result = _val(labelled, labelled["yolo"])
    assert result["labels"]["format"] == "yolo"
    assert result["map50"] == pytest.approx(1.0, abs=1e-3) and result["map50_95"] > 0.95  # 6-digit txt rounding


def test_perturbed_labels_score_lower(labelled: dict[str, Any]) -> None:
    coco = json.loads(json.dumps(labelled["coco"]))
    rng = np.random.default_rng(0)
    for a in coco["annotations"]:
        x, y, w, h = a["bbox"]
        dx, dy = rng.uniform(-0.25, 0.25, 2) * (w, h)  # boxes moved by up to a quarter of their size
        a["bbox"] = [x + dx, y + dy, w, h]
    coco["annotations"] = coco["annotations"][::2] + [  # and some objects the model did not find
        {**a, "id": 10_000 + i, "bbox": [5.0, 5.0, 30.0, 30.0]} for i, a in enumerate(coco["annotations"][1::2])]
    path = labelled["root"] / "perturbed.json"
    path.write_text(json.dumps(coco))
    result = _val(labelled, path)
    assert result["map50_95"] < 0.6 and result["map50"] < 0.9


def test_table_output_lists_classes(labelled: dict[str, Any]) -> None:
    r = run_cli("val", str(labelled["model"]), "--images", str(labelled["images"]),
                "--labels", str(labelled["root"] / "coco.json"), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["class", "images", "instances", "AP50", "AP50-95"]
    assert lines[1].split()[:2] == ["all", str(len(IMAGES))] and lines[1].split()[-2:] == ["1.000", "1.000"]
    assert any(line.startswith("person") for line in lines)


def test_missing_labels_file_is_one_line(labelled: dict[str, Any]) -> None:
    r = run_cli("val", str(labelled["model"]), "--images", str(labelled["images"]),
                "--labels", str(labelled["root"] / "nope.json"), timeout=TIMEOUT)
    assert_one_line_error(r, "nope.json: labels not found")


def test_no_class_in_common_is_one_line(labelled: dict[str, Any]) -> None:
    coco = {**labelled["coco"], "categories": [{"id": c["id"], "name": f"widget {c['id']}"}
                                               for c in labelled["coco"]["categories"]]}
    path = labelled["root"] / "widgets.json"
    path.write_text(json.dumps(coco))
    r = run_cli("val", str(labelled["model"]), "--images", str(labelled["images"]), "--labels", str(path),
                timeout=TIMEOUT)
    assert_one_line_error(r, "no name in common")


def test_yolo_labels_without_names_and_bad_lines_are_one_line(labelled: dict[str, Any], tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(labelled["yolo"], bare)
    (bare / "classes.txt").unlink()
    r = run_cli("val", str(labelled["model"]), "--images", str(labelled["images"]), "--labels", str(bare),
                timeout=TIMEOUT)
    assert_one_line_error(r, "YOLO labels need class names")
    (bare / "bus.txt").write_text("0 0.5 0.5 0.1\n")
    r = run_cli("val", str(labelled["model"]), "--images", str(labelled["images"]), "--labels", str(bare),
                "--label-names", "coco", timeout=TIMEOUT)
    assert_one_line_error(r, "bus.txt:1: expected 'class cx cy w h'")


def test_class_mapping_by_name() -> None:
    assert class_mapping(["person", "motorbike", "tvmonitor"], ["TV", "motorcycle", "cat"]) == {1: 1, 2: 0}
    assert canonical_name("Potted_Plant") == canonical_name("pottedplant") == "potted plant"


def _cocoeval_map(gt_path: Path, results: Path, category_ids: list[int]) -> tuple[float, float]:
    """What a user does with the saved file: pycocotools' loadRes and COCOeval, mean AP over the classes
    with instances (val's definition)."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(gt_path))
        dt = gt.loadRes(str(results))
        ev = COCOeval(gt, dt, "bbox")
        ev.params.catIds = category_ids
        ev.evaluate()
        ev.accumulate()
    p = ev.eval["precision"]
    ap = [np.mean(p[:, :, k, 0, -1][p[:, :, k, 0, -1] > -1]) for k in range(len(category_ids))]
    ap50 = [np.mean(p[0, :, k, 0, -1][p[0, :, k, 0, -1] > -1]) for k in range(len(category_ids))]
    return float(np.mean(ap50)), float(np.mean(ap))


def test_saved_json_is_coco_results_that_pycocotools_scores_as_val_does(labelled: dict[str, Any]) -> None:
    coco = json.loads(json.dumps(labelled["coco"]))
    rng = np.random.default_rng(1)
    for a in coco["annotations"]:  # moved boxes: a score well below 1, so agreement means something
        x, y, w, h = a["bbox"]
        dx, dy = rng.uniform(-0.2, 0.2, 2) * (w, h)
        a["bbox"] = [x + dx, y + dy, w, h]
    gt_path = labelled["root"] / "moved.json"
    gt_path.write_text(json.dumps(coco))
    preds = labelled["root"] / "moved-preds.json"
    result = _val(labelled, gt_path, "--save-json", str(preds))
    assert 0.1 < result["map50_95"] < 0.9
    used = sorted({a["category_id"] for a in coco["annotations"]})
    map50, map50_95 = _cocoeval_map(gt_path, preds, used)
    assert map50_95 == pytest.approx(result["map50_95"], abs=1e-5)
    assert map50 == pytest.approx(result["map50"], abs=1e-5)
