"""``edgert compare``: how close a candidate model (INT8 Q/DQ, engine) stays to a reference (FP32).

Runs both through the same preprocessing and decoding on the same frames, prints per-output error
statistics and, for detectors, the candidate's mAP@0.5 and mAP@0.5:0.95 with the reference's
detections as ground truth (COCO-style: 101-point interpolation, averaged over classes).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgert.cli.progress import Progress


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("compare", help="accuracy of a candidate model against a reference (mAP vs FP32)",
                              description="Compare a candidate model with a reference on the same frames.")
    p.add_argument("reference", help="reference model (FP32 ONNX)")
    p.add_argument("candidate", help="candidate model (Q/DQ ONNX, engine)")
    p.add_argument("--images", metavar="DIR", help="folder of images (recursive)")
    p.add_argument("--video", metavar="PATH", help="video file to take frames from")
    p.add_argument("--frames", type=int, default=50, metavar="N", help="frames of --video, evenly spread (default 50)")
    p.add_argument("--skip-used", metavar="REPORT.json",
                   help="leave out the images a calibration report says it used (measure on held-out images)")
    p.add_argument("--config", metavar="pipeline.yaml", help="pipeline config (preprocess, decode)")
    p.add_argument("--backend", default="onnxruntime", help="backend for both models (default onnxruntime)")
    p.add_argument("--candidate-backend", help="backend for the candidate if different")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    p.set_defaults(func=run)


def _used_files(report: str) -> list[Path]:
    from edgert.errors import ConfigError

    try:
        data = json.loads(Path(report).read_text(encoding="utf-8"))
        return [Path(p) for p in data["images"]["used_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{report}: not a calibration report ({type(exc).__name__}: {exc})") from None


def format_comparison(r: dict[str, Any]) -> str:
    m, s = r["map"], r["map_strict"]
    lines = [f"frames       {r['frames']}",
             f"mAP@0.5:0.95 {m['map50_95']}   mAP@0.5 {m['map50']}   (candidate boxes >= {r['candidate_conf']}; "
             f"{m['ground_truth']} reference boxes >= {r['reference_conf']}, {m['predictions']} candidate boxes)",
             f"strict       mAP@0.5:0.95 {s['map50_95']}   mAP@0.5 {s['map50']}   "
             f"(candidate boxes >= {r['reference_conf']})",
             f"speed        reference {r['reference_ms']} ms/frame, candidate {r['candidate_ms']} ms/frame"]
    for o in r["outputs"]:
        lines.append(f"output {o['output']}: max |err| {o['max_abs_error']}, mean |err| {o['mean_abs_error']}, "
                     f"relative L2 {o['relative_l2']}, per-feature MSE/var {o['normalized_mse']}")
    return "\n".join(lines)


def _frame_total(args: argparse.Namespace, exclude: list[Path]) -> int | None:
    """The images (less those calibration used) plus the video's frames: a video shorter than --frames ends
    the bar early."""
    from edgert.calib.dataset import CalibrationImages

    total = args.frames if args.video else 0
    if args.images:
        try:
            total += len(CalibrationImages(args.images, exclude=frozenset(Path(p) for p in exclude)))
        except Exception:  # evaluation_frames reports a bad folder in its own words
            return None
    return total or None


def _counted(frames: Iterator[tuple[str, Any]], progress: Progress) -> Iterator[tuple[str, Any]]:
    for item in frames:
        yield item
        progress.update()


def run(args: argparse.Namespace) -> int:
    from edgert.calib.comparison import compare_detectors, evaluation_frames
    from edgert.config import PipelineConfig, load_config
    from edgert.errors import ConfigError

    if args.frames < 1:
        raise ConfigError(f"--frames must be >= 1, got {args.frames}")
    config = load_config(args.config) if args.config else PipelineConfig()
    exclude = _used_files(args.skip_used) if args.skip_used else []
    frames = evaluation_frames(args.images, args.video, args.frames, exclude)
    with Progress("compare", _frame_total(args, exclude), unit="frame", quiet=args.json) as progress:
        report = compare_detectors(args.reference, args.candidate, _counted(frames, progress), config,
                                   backend=args.backend, candidate_backend=args.candidate_backend)
    print(json.dumps(report, indent=2) if args.json else format_comparison(report))
    return 0
