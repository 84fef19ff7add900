"""``edgert val``: a detector's mAP against labelled images (COCO JSON or a YOLO txt folder).

The model runs on every labelled image (any backend or engine, through the same preprocessing and
decoding as ``edgert run``); pycocotools' COCOeval, the reference evaluator, scores the detections:
AP@0.5 and AP@0.5:0.95 per class, over the classes the model and the labels share. Classes are matched
by name (case, ``_``/``-`` and the darknet/COCO spellings such as ``motorbike``/``motorcycle`` do not
matter), so a model whose class 0 is ``person`` is scored against whatever id the labels give ``person``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from edgert._lazy import lazy_import
from edgert.errors import InputError
from edgert.image_file import ImageSkipped, ImageTooLarge, decode_image_file, max_pixels
from edgert.vision.detections import Detections

__all__ = ["GroundTruth", "LabelledImage", "ValResult", "canonical_name", "evaluate", "load_labels"]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})

#: The darknet spellings edgert's COCO table uses (and many YOLO exports) -> COCO's own category names.
_ALIASES = {
    "motorbike": "motorcycle", "aeroplane": "airplane", "sofa": "couch", "pottedplant": "potted plant",
    "diningtable": "dining table", "tvmonitor": "tv", "hair dryer": "hair drier",
}


def canonical_name(name: str) -> str:
    """The form two class names are compared in: lower case, single spaces, COCO spelling."""
    key = re.sub(r"[\s_\-]+", " ", str(name)).strip().lower()
    return _ALIASES.get(key, key)


@dataclass(frozen=True)
class LabelledImage:
    path: Path
    width: int
    height: int
    boxes: np.ndarray  # (N, 4) xyxy pixels
    classes: np.ndarray  # (N,) indices into GroundTruth.names
    crowd: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    image_id: int | None = None  # the labels' own id (COCO ``images[].id``; YOLO: position in file order, from 1)


@dataclass(frozen=True)
class GroundTruth:
    names: tuple[str, ...]
    images: tuple[LabelledImage, ...]
    source: str  # "coco" or "yolo"
    missing_images: int = 0  # labelled images not found in the images folder
    category_ids: tuple[int, ...] = ()  # the labels' own id of each name (COCO ids; YOLO: the class number)
    unreadable_images: int = 0  # image files that did not decode (skipped, with their labels)
    large_images: int = 0  # image files over the pixel budget (skipped, with their labels)


# --------------------------------------------------------------------------------------------------
# Labels


def load_labels(labels: str | Path, images: str | Path, label_names: Sequence[str] | None = None) -> GroundTruth:
    """COCO JSON (a file) or YOLO txt labels (a folder) for the images in ``images``."""
    labels_path, images_dir = Path(labels).expanduser(), Path(images).expanduser()
    if not images_dir.is_dir():
        raise InputError(f"{images_dir}: images folder not found")
    if not labels_path.exists():
        raise InputError(f"{labels_path}: labels not found. Note: give a COCO JSON file or a folder of YOLO .txt files")
    if labels_path.is_dir():
        return _load_yolo(labels_path, images_dir, label_names)
    return _load_coco(labels_path, images_dir)


def _image_files(folder: Path) -> dict[str, Path]:
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    return {p.relative_to(folder).as_posix(): p for p in files}


def _load_coco(path: Path, images_dir: Path) -> GroundTruth:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        categories = {int(c["id"]): str(c["name"]) for c in data["categories"]}
        entries = [(int(im["id"]), str(im["file_name"]), int(im.get("width", 0)), int(im.get("height", 0)))
                   for im in data["images"]]
        anns = data.get("annotations", [])
        by_image: dict[int, list[tuple[list[float], int, bool]]] = {}
        for a in anns:
            x, y, w, h = (float(v) for v in a["bbox"])
            if not all(math.isfinite(v) for v in (x, y, w, h)) or w < 0 or h < 0:
                raise ValueError(f"annotation {a.get('id')} has bbox {a['bbox']}: expected finite [x, y, w, h] "
                                 "with w, h >= 0")
            by_image.setdefault(int(a["image_id"]), []).append(
                ([x, y, x + w, y + h], int(a["category_id"]), bool(a.get("iscrowd", 0))))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read labels: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a COCO annotation file (need images, annotations, categories): "
                         f"{type(exc).__name__}: {exc}") from None
    if not categories:
        raise InputError(f"{path}: no categories in the COCO file")
    ids = sorted(categories)
    index = {cid: i for i, cid in enumerate(ids)}
    names = tuple(categories[c] for c in ids)
    files = _image_files(images_dir)
    by_basename = {Path(k).name: v for k, v in files.items()}
    out: list[LabelledImage] = []
    missing = 0
    for image_id, file_name, width, height in entries:
        found = files.get(Path(file_name).as_posix()) or by_basename.get(Path(file_name).name)
        if found is None:
            missing += 1
            continue
        rows = by_image.get(image_id, [])
        unknown = [c for _, c, _ in rows if c not in index]
        if unknown:
            raise InputError(f"{path}: annotation of image {file_name} has category_id {unknown[0]}, "
                             "which is not in categories")
        out.append(LabelledImage(
            found, width, height,
            np.array([r[0] for r in rows], np.float64).reshape(-1, 4),
            np.array([index[r[1]] for r in rows], np.int64),
            np.array([r[2] for r in rows], bool), image_id))
    if not out:
        raise InputError(f"{path}: none of its {len(entries)} images is in {images_dir}")
    if missing:
        log.warning("%s: %d of its %d images are not in %s; scoring the %d found", path, missing, len(entries),
                    images_dir, len(out))
    return GroundTruth(names, tuple(out), "coco", missing, tuple(ids))


def _yolo_names(labels_dir: Path) -> tuple[str, ...] | None:
    """Class names beside YOLO labels: classes.txt (labelImg, CVAT) or a dataset YAML's ``names``."""
    for folder in (labels_dir, labels_dir.parent):
        classes = folder / "classes.txt"
        if classes.is_file():
            return tuple(line.strip() for line in _text(classes).splitlines() if line.strip())
        for name in ("data.yaml", "dataset.yaml"):
            spec = folder / name
            if spec.is_file():
                try:
                    names = (yaml.safe_load(_text(spec)) or {}).get("names")
                except (yaml.YAMLError, AttributeError) as exc:
                    raise InputError(f"{spec}: cannot read class names: {exc}") from None
                if isinstance(names, Mapping):
                    return tuple(str(names[k]) for k in sorted(names, key=int))
                if isinstance(names, list):
                    return tuple(str(n) for n in names)
    return None


def _text(path: Path) -> str:
    """A label file's text; one that is not UTF-8 (or unreadable) is a one-line error, not a traceback."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}): labels must be UTF-8") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read labels: {exc.strerror or exc}") from None


def _normalised_box(box: Sequence[float], slack: float = 1e-3) -> bool:
    """cx, cy in [0, 1] and w, h in (0, 1], with a little slack for exporters' rounding."""
    cx, cy, w, h = box
    return -slack <= cx <= 1 + slack and -slack <= cy <= 1 + slack and 0 < w <= 1 + slack and 0 < h <= 1 + slack


def _load_yolo(labels_dir: Path, images_dir: Path, label_names: Sequence[str] | None) -> GroundTruth:
    names = tuple(label_names) if label_names else _yolo_names(labels_dir)
    if not names:
        raise InputError(f"{labels_dir}: YOLO labels need class names: put classes.txt (one name per line) or "
                         "data.yaml (names: [...]) there, or pass --label-names FILE|coco")
    budget = max_pixels()
    skipped = [0, 0]  # unreadable, too large
    files = _image_files(images_dir)
    out: list[LabelledImage] = []
    with_labels = 0
    for rel, image in files.items():
        txt = labels_dir / Path(rel).with_suffix(".txt")
        if not txt.is_file():
            txt = labels_dir / (Path(rel).stem + ".txt")
        rows: list[list[float]] = []
        if txt.is_file():  # no file: an image with no objects (YOLO's convention for background images)
            with_labels += 1
            for n, line in enumerate(_text(txt).splitlines(), 1):
                parts = line.split()
                if not parts:
                    continue
                if len(parts) > 5:  # scoring its first four numbers as a box would be a wrong score, silently
                    raise InputError(f"{txt}:{n}: {len(parts) - 1} numbers after the class: a segmentation polygon "
                                     "(or keypoints) row, and val scores boxes. Note: give detection labels, "
                                     "'class cx cy w h' (normalised) per line")
                try:
                    values = [float(v) for v in parts[:5]]
                except ValueError:
                    values = []
                if len(values) != 5 or not all(math.isfinite(v) for v in values) or values[0] != int(values[0]) \
                        or not 0 <= values[0] < len(names) or not _normalised_box(values[1:]):
                    raise InputError(f"{txt}:{n}: expected 'class cx cy w h' (normalised) with class "
                                     f"0..{len(names) - 1}, got {line.strip()[:60]!r}")
                rows.append(values)
        try:
            frame = decode_image_file(image, budget)  # bounded, and by bytes: any file name works
        except ImageSkipped as exc:
            skipped[isinstance(exc, ImageTooLarge)] += 1
            log.warning("%s; skipped", exc)
            continue
        height, width = frame.shape[:2]
        arr = np.array(rows, np.float64).reshape(-1, 5)
        cx, cy, w, h = arr[:, 1] * width, arr[:, 2] * height, arr[:, 3] * width, arr[:, 4] * height
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        out.append(LabelledImage(image, width, height, boxes, arr[:, 0].astype(np.int64), np.zeros(len(arr), bool),
                                 len(out) + 1))
    if not with_labels:
        raise InputError(f"{labels_dir}: no label file matches an image in {images_dir} "
                         "(expected NAME.txt per NAME.jpg)")
    return GroundTruth(names, tuple(out), "yolo", 0, unreadable_images=skipped[0], large_images=skipped[1],
                       category_ids=tuple(range(len(names))))


# --------------------------------------------------------------------------------------------------
# Scoring


@dataclass(frozen=True)
class ValResult:
    map50: float
    map50_95: float
    per_class: dict[str, dict[str, Any]]  # label class name -> ap50, ap50_95, instances, predictions
    images: int
    instances: int
    predictions: int
    unmatched_label_classes: tuple[str, ...]  # in the labels, not in the model
    unmatched_model_classes: int  # model classes not in the labels (their detections are not scored)

    def to_dict(self) -> dict[str, Any]:
        return {
            "map50": _num(self.map50), "map50_95": _num(self.map50_95), "images": self.images,
            "instances": self.instances, "predictions": self.predictions,
            "per_class": {k: {**v, "ap50": _num(v["ap50"]), "ap50_95": _num(v["ap50_95"])}
                          for k, v in self.per_class.items()},
            "label_classes_not_in_model": list(self.unmatched_label_classes),
            "model_classes_not_in_labels": self.unmatched_model_classes,
        }


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 5)


def class_mapping(model_names: Sequence[str], label_names: Sequence[str]) -> dict[int, int]:
    """model class id -> label class index, by name; :class:`InputError` when they share none."""
    by_name = {canonical_name(n): i for i, n in enumerate(label_names)}
    mapping = {i: by_name[canonical_name(n)] for i, n in enumerate(model_names) if canonical_name(n) in by_name}
    if not mapping:
        shown = ", ".join(list(model_names)[:5]) or "none (the model has no class names)"
        raise InputError(f"the model's classes ({shown}...) and the labels' ({', '.join(list(label_names)[:5])}...) "
                         "have no name in common. Note: set decode.names (a labels file or coco) for a model "
                         "without names")
    return mapping


def evaluate(truth: GroundTruth, detections: Sequence[Detections], model_names: Sequence[str]) -> ValResult:
    """COCO mAP of ``detections`` (one per image of ``truth``, in order) with pycocotools."""
    cocoeval = lazy_import("pycocotools.cocoeval", "edgert val")
    coco_mod = lazy_import("pycocotools.coco", "edgert val")
    mapping = class_mapping(model_names, truth.names)
    used = sorted(set(mapping.values()))
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    instances = np.zeros(len(truth.names), np.int64)
    predicted = np.zeros(len(truth.names), np.int64)
    for image_id, (image, found) in enumerate(zip(truth.images, detections), 1):
        images.append({"id": image_id, "file_name": image.path.name, "width": image.width, "height": image.height})
        for k, (box, cls) in enumerate(zip(image.boxes.tolist(), image.classes.tolist())):
            crowd = bool(image.crowd[k]) if image.crowd.size else False
            w, h = box[2] - box[0], box[3] - box[1]
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": int(cls) + 1,
                                "bbox": [box[0], box[1], w, h], "area": w * h, "iscrowd": int(crowd)})
            if not crowd:
                instances[cls] += 1
        for box, conf, cid in zip(found.xyxy.tolist(), found.confidence.tolist(), found.class_id.tolist()):
            label = mapping.get(int(cid))
            if label is None:
                continue
            predicted[label] += 1
            results.append({"image_id": image_id, "category_id": label + 1, "score": float(conf),
                            "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
    categories = [{"id": i + 1, "name": n} for i, n in enumerate(truth.names)]
    ap50 = np.full(len(truth.names), np.nan)
    ap = np.full(len(truth.names), np.nan)
    if results:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            gt = coco_mod.COCO()
            gt.dataset = {"images": images, "annotations": annotations, "categories": categories}
            gt.createIndex()
            dt = gt.loadRes(results)
            ev = cocoeval.COCOeval(gt, dt, "bbox")
            ev.params.catIds = [c + 1 for c in used]
            ev.evaluate()
            ev.accumulate()
        precision = ev.eval["precision"]  # [iou thresholds, recall points, classes, area ranges, max dets]
        for k, cat in enumerate(ev.params.catIds):
            p_all = precision[:, :, k, 0, -1]
            p_50 = precision[0, :, k, 0, -1]
            ap[cat - 1] = float(np.mean(p_all[p_all > -1])) if np.any(p_all > -1) else math.nan
            ap50[cat - 1] = float(np.mean(p_50[p_50 > -1])) if np.any(p_50 > -1) else math.nan
    else:  # nothing detected: every class with instances scores 0
        for c in used:
            if instances[c]:
                ap[c] = ap50[c] = 0.0
    scored = [c for c in used if instances[c] > 0]
    per_class = {truth.names[c]: {"ap50": float(ap50[c]), "ap50_95": float(ap[c]), "instances": int(instances[c]),
                                  "predictions": int(predicted[c])} for c in used}
    mean50 = float(np.nanmean([ap50[c] for c in scored])) if scored else math.nan
    mean = float(np.nanmean([ap[c] for c in scored])) if scored else math.nan
    unmatched_labels = tuple(n for i, n in enumerate(truth.names) if i not in set(used))
    return ValResult(mean50, mean, per_class, len(truth.images), int(instances.sum()), len(results),
                     unmatched_labels, len(model_names) - len(mapping))


def coco_predictions(truth: GroundTruth, detections: Sequence[Detections],
                     model_names: Sequence[str]) -> list[dict[str, Any]]:
    """Detections in COCO results format (``--save-json``), what pycocotools' ``loadRes`` reads: ``image_id``
    and ``category_id`` are the labels' own ids (classes matched by name, as :func:`evaluate` does; a model
    class the labels lack is left out), ``bbox`` is x, y, w, h in pixels, ``score`` the confidence."""
    mapping = class_mapping(model_names, truth.names)
    category_ids = truth.category_ids or tuple(range(1, len(truth.names) + 1))
    out = []
    for k, (image, found) in enumerate(zip(truth.images, detections), 1):
        image_id = image.image_id if image.image_id is not None else k
        for box, conf, cid in zip(found.xyxy.tolist(), found.confidence.tolist(), found.class_id.tolist()):
            label = mapping.get(int(cid))
            if label is None:
                continue
            out.append({"image_id": image_id, "category_id": int(category_ids[label]), "score": float(conf),
                        "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
    return out
