#!/usr/bin/env python3
"""One INT8 calibration variant of one asset detector, measured on frames the calibration never saw.

Calibrates with ``edgert.calib.calibrate`` (32 images of the asset folder, seed 0, the options given as
JSON), then compares the Q/DQ model with FP32 (``compare_detectors``, ONNX Runtime CPU) on the folder's
images calibration did not use plus ``--frames`` frames of ``vtest.avi`` (offset 0: disjoint from the
frames a ``--check-video`` would use, and the check set of the default pass holds no held-out image).
Prints one JSON line: held-out mAP@0.5:0.95 (and strict; and apart on the photos and on the video frames),
the check-set mAP, float layers, time, peak RSS; and where the video's loss is (``video_swap``): the INT8
model's raw output decoded with FP32's box channels in place of its own (what its scores cost) and with
FP32's score channels (what its boxes cost), for single-output models whose channel axis is 4 box values +
(objectness +) classes.
The figures of calibration/README.md's "methods x models" table come from it:

    python scripts/eval_int8.py nanodet '{}'                          # the default
    python scripts/eval_int8.py yolov8s '{"max_drop": null}'          # full INT8
    python scripts/eval_int8.py nanodet '{"method": "mse", "max_drop": null}'
    python scripts/eval_int8.py nanodet '{"seed": 3}' --fp16     # the metric's floor: FP16, same frames

``--fp16``: no calibration; the model converted to FP16 (``edgert.rewrite.fp16``, as ``edgert convert
--precision fp16``) is measured in its place, on the frames the INT8 run with the same ``seed`` holds out:
how far from 1.0 the held-out comparison is for a model with no INT8 in it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ASSETS = Path(os.environ.get("EDGERT_ASSETS", ROOT.parent / "shared" / "assets"))
MODELS = {
    "nanodet": ASSETS / "models/detection/nanodet-m-416-coco-v8layout.onnx",
    "yolov8s": ASSETS / "models/detection/yolov8s-fall-640.onnx",
    "yolov3tiny": ASSETS / "models/detection/yolov3-tiny-coco-416.onnx",  # not tuned on: the check of the default
}
MODELS_NAME = {v: k for k, v in MODELS.items()}


def _versions() -> dict[str, str]:
    """The libraries a figure depends on (a fresh venv resolves them anew: session 9 saw NanoDet's figures
    move between machines, cause not traced)."""
    import cv2
    import numpy
    import onnxruntime

    return {"onnxruntime": onnxruntime.__version__, "opencv": cv2.__version__, "numpy": numpy.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=tuple(MODELS))
    ap.add_argument("options", nargs="?", default="{}", help="CalibrationOptions fields as JSON")
    ap.add_argument("--frames", type=int, default=50, help="frames of vtest.avi in the evaluation (default 50)")
    ap.add_argument("--out", type=Path, help="Q/DQ model to write (default: a temporary folder)")
    ap.add_argument("--fp16", action="store_true", help="measure the FP16 model instead (no calibration)")
    args = ap.parse_args()

    from edgert.calib.calibrate import CalibrationOptions, calibrate
    from edgert.calib.comparison import compare_detectors, evaluation_frames

    options = json.loads(args.options)
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}  # tuple fields
    out = args.out or Path(tempfile.mkdtemp(prefix="edgert-int8-")) / f"{args.model}.int8.onnx"
    src = MODELS[args.model]
    if args.fp16:
        return _fp16(src, out.with_suffix(".fp16.onnx"), options, args.frames)
    t0 = time.perf_counter()
    report = calibrate(src, ASSETS / "images", out, options=CalibrationOptions(force=True, **options), progress=False)
    seconds = time.perf_counter() - t0
    used = [Path(p) for p in report["images"]["used_files"]]
    frames = list(evaluation_frames(ASSETS / "images", ASSETS / "video/vtest.avi", args.frames, used))
    held = compare_detectors(src, out, frames)
    # the two halves apart: 10 photos of ~40 classes (most with 1-3 boxes: one box is ~0.02 of that mAP)
    # and the video's pedestrians (hundreds of small boxes of one class), where INT8 loses most
    video = [f for f in frames if "#" in f[0]]
    parts = {"photos": [f for f in frames if "#" not in f[0]], "video": video}
    part_map = {k: compare_detectors(src, out, v)["map"]["map50_95"] for k, v in parts.items() if v}
    swap = _swap(src, out, video)
    check = (report.get("accuracy") or {}).get("map") or {}
    print(json.dumps({
        "model": args.model, "options": options, "versions": _versions(), "heldout_map50_95": held["map"]["map50_95"],
        "heldout_strict": held["map_strict"]["map50_95"], "heldout_frames": held["frames"],
        "heldout_photos": part_map.get("photos"), "heldout_video": part_map.get("video"), "video_swap": swap,
        "check_map50_95": check.get("map50_95"), "float_layers": report["summary"]["float_layers"],
        "quantized_layers": report["summary"]["quantized_layers"], "seconds": round(seconds, 1),
        "int8_mac_share": (report.get("macs") or {}).get("int8_share"),
        "verdict": (report.get("verdict") or {}).get("met"), "timing_s": report.get("timing_s"),
        "sensitivity_steps": (report.get("sensitivity") or {}).get("steps"),
        "peak_rss_mb": report["peak_rss_mb"], "output": str(out),
    }))
    return 0


def _fp16(src: Path, out: Path, options: dict, count: int) -> int:
    """The held-out comparison of the FP16 model (the frames ``options``' seed leaves out of calibration)."""
    from edgert.calib.calibrate import CalibrationOptions
    from edgert.calib.comparison import compare_detectors, evaluation_frames
    from edgert.calib.dataset import CalibrationImages
    from edgert.rewrite.fp16 import convert_file

    opts = CalibrationOptions(**options)
    draw = CalibrationImages(ASSETS / "images", num=opts.num, seed=opts.seed, quiet=True)
    for _ in draw:  # the images calibration with this seed reads (``used`` fills as they are read)
        pass
    used = list(draw.used)
    t0 = time.perf_counter()
    convert_file(src, out)
    seconds = time.perf_counter() - t0
    frames = list(evaluation_frames(ASSETS / "images", ASSETS / "video/vtest.avi", count, used))
    held = compare_detectors(src, out, frames)
    video = [f for f in frames if "#" in f[0]]
    photos = [f for f in frames if "#" not in f[0]]
    print(json.dumps({
        "model": MODELS_NAME[src], "precision": "fp16", "options": options, "versions": _versions(),
        "heldout_map50_95": held["map"]["map50_95"], "heldout_strict": held["map_strict"]["map50_95"],
        "heldout_frames": held["frames"],
        "heldout_photos": compare_detectors(src, out, photos)["map"]["map50_95"] if photos else None,
        "heldout_video": compare_detectors(src, out, video)["map"]["map50_95"] if video else None,
        "video_swap": _swap(src, out, video), "convert_seconds": round(seconds, 1), "output": str(out),
    }))
    return 0


def _swap(src: Path, out: Path, frames: list) -> dict | None:
    """mAP@0.5:0.95 and @0.5 of INT8 against FP32 on ``frames``: as is, with FP32's boxes, with FP32's scores."""
    import dataclasses

    from edgert.calib.accuracy import detection_map
    from edgert.calib.comparison import PRED_CONF
    from edgert.config import PipelineConfig
    from edgert.vision.detections import Detections
    from edgert.vision.detector import Detector

    config = PipelineConfig()
    low = dataclasses.replace(config, decode=dataclasses.replace(config.decode, conf=PRED_CONF))
    with Detector(src, config, backend="onnxruntime") as ref, Detector(out, low, backend="onnxruntime") as cand:
        if len(ref.output_specs) != 1:
            return None
        got: dict = {"int8": [], "fp32_boxes": [], "fp32_scores": []}
        truth = []
        for _, frame in frames:
            truth.append(ref(frame))
            raw_ref = {k: v.copy() for k, v in ref.session.outputs.items()}
            transform = cand.preprocess(frame)
            raw = {k: v.copy() for k, v in cand.session.infer().items()}
            (name, r), q = next(iter(raw_ref.items())), raw[next(iter(raw))]
            axes = [i for i, n in enumerate(r.shape) if n in (4 + len(ref.names), 5 + len(ref.names))]
            if not axes:
                return None
            box = [slice(None)] * r.ndim
            box[axes[0]] = slice(0, 4)
            for kind, (boxes, scores) in (("int8", (q, q)), ("fp32_boxes", (r, q)), ("fp32_scores", (q, r))):
                mixed = scores.copy()
                mixed[tuple(box)] = boxes[tuple(box)]
                d = cand.decoder({name: mixed}, transform)
                got[kind].append(Detections(d.xyxy, d.confidence, d.class_id, d.names))
    result = {}
    for kind, dets in got.items():
        m = detection_map(truth, dets)
        result[kind] = {"map50_95": round(float(m.map50_95), 5), "map50": round(float(m.map50), 5)}
    return result


if __name__ == "__main__":
    sys.exit(main())
