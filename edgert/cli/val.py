"""``edgert val``: mAP@0.5 and mAP@0.5:0.95 per class of a model (ONNX or engine) on labelled images."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "val", help="mAP of a detector on labelled images (COCO JSON or YOLO txt labels)",
        description="Run MODEL on every labelled image in --images and score its detections with pycocotools "
                    "(pip install 'edgert[val]'): AP@0.5 and AP@0.5:0.95 per class. Classes are matched by name "
                    "between the model and the labels.")
    p.add_argument("model", help="the model: ONNX, or an engine for its backend")
    p.add_argument("--images", required=True, metavar="DIR", help="folder of the labelled images (recursive)")
    p.add_argument("--labels", required=True, metavar="COCO.json|DIR",
                   help="COCO annotation JSON, or a folder of YOLO .txt labels (NAME.txt per NAME.jpg) with "
                        "classes.txt or data.yaml for the class names")
    p.add_argument("--label-names", metavar="FILE|coco", help="class names of YOLO labels (one per line, or coco)")
    p.add_argument("--config", metavar="pipeline.yaml", help="pipeline config (preprocess, decode)")
    p.add_argument("--backend", default="auto", help="backend (default: the best available)")
    p.add_argument("--conf", type=float, default=0.001,
                   help="confidence threshold (default 0.001: mAP needs the low-confidence tail)")
    p.add_argument("--iou", type=float, help="NMS IoU threshold (default: the config's)")
    p.add_argument("--save-json", metavar="PATH",
                   help="write the detections in COCO results format (image_id, category_id, bbox, score; "
                        "the labels' ids), for pycocotools' loadRes")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def format_result(r: dict[str, Any]) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [f"{'class':<20} {'images':>6} {'instances':>9} {'AP50':>6} {'AP50-95':>7}",
             f"{'all':<20} {r['images']:>6} {r['instances']:>9} {f(r['map50']):>6} {f(r['map50_95']):>7}"]
    for name, c in r["per_class"].items():
        if not c["instances"]:  # in both, but not in these labels: nothing to score (the JSON lists them)
            continue
        lines.append(f"{name[:20]:<20} {'':>6} {c['instances']:>9} {f(c['ap50']):>6} {f(c['ap50_95']):>7}")
    if r["label_classes_not_in_model"]:
        lines.append(f"not scored (not in the model): {', '.join(r['label_classes_not_in_model'])}")
    return "\n".join(lines)


def _label_names(arg: str | None) -> tuple[str, ...] | None:
    from edgert.config import DecodeConfig, from_mapping

    if arg is None:
        return None
    names = from_mapping(DecodeConfig, {"names": arg}).names  # the same rules as decode.names
    return names


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import logging

    from edgert.atomic_file import write_atomic
    from edgert.cli.progress import Progress
    from edgert.config import PipelineConfig, load_config
    from edgert.errors import ConfigError, InputError
    from edgert.image_file import ImageSkipped, ImageTooLarge
    from edgert.vision.detector import Detector
    from edgert.vision.validate import coco_predictions, evaluate, load_labels

    if not 0.0 <= args.conf <= 1.0:
        raise ConfigError(f"--conf must be in 0..1, got {args.conf}")
    if not Path(args.model).exists():
        raise InputError(f"{args.model}: model not found")
    truth = load_labels(args.labels, args.images, _label_names(args.label_names))
    config = load_config(args.config) if args.config else PipelineConfig()
    decode = dataclasses.replace(config.decode, conf=args.conf, **({"iou": args.iou} if args.iou is not None else {}))
    config = dataclasses.replace(config, decode=decode)
    found, kept = [], []
    unreadable, large = truth.unreadable_images, truth.large_images
    with Detector(args.model, config, backend=args.backend) as det, \
            Progress("val", len(truth.images), unit="image", quiet=args.json) as progress:
        for image in truth.images:
            progress.update()
            try:
                found.append(det(image.path))
            except ImageSkipped as exc:  # a counted skip, its labels with it: never a crash or a zero score
                too_large = isinstance(exc, ImageTooLarge)
                unreadable, large = unreadable + (not too_large), large + too_large
                logging.getLogger("edgert.val").warning("%s; skipped", exc)
                continue
            kept.append(image)
        names = det.names
    truth = dataclasses.replace(truth, images=tuple(kept))
    result = evaluate(truth, found, names).to_dict()
    result["model"] = str(args.model)
    result["labels"] = {"path": str(args.labels), "format": truth.source, "missing_images": truth.missing_images,
                        "unreadable_images": unreadable, "images_over_pixel_budget": large}
    if args.save_json:
        out = Path(args.save_json)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(out, json.dumps(coco_predictions(truth, found, names)))  # whole, or the old file
        except OSError as exc:
            raise InputError(f"{out}: cannot write the detections: {exc.strerror or exc}") from None
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 0
