"""``edgert demo``: the main job in one command, on the full assets or on the demo data the package carries.

NanoDet (COCO) on the sample pedestrian video with the best backend this machine has, writing an
annotated video (``out/demo.mp4`` by default) and printing the run's summary. The full assets
(``video/vtest.avi``, the FP32 model) are found through ``EDGERT_ASSETS`` or ``../shared/assets`` beside the
working directory or the project; without them the demo runs on ``edgert/demo_data`` (NanoDet with INT8
weights and a 20 s half-size cut of the same video, made by ``scripts/make_demo_data.py``), and says which.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

DEMO_MODEL = "models/detection/nanodet-m-416-coco-v8layout.onnx"
DEMO_VIDEO = "video/vtest.avi"
#: What the package carries (``edgert/demo_data``: licences in its LICENSES file).
PACKAGED_MODEL = "nanodet-m-416-int8w.onnx"
PACKAGED_VIDEO = "vtest-384x288.mp4"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="detect people in the sample video with NanoDet and write an annotated video",
        description="NanoDet COCO on the assets' video/vtest.avi with the best backend available; writes an "
                    "annotated video and prints the summary. Uses the full assets (EDGERT_ASSETS or ../shared/assets) "
                    "when they are there, else the small model and clip the package carries.",
    )
    p.add_argument("--out", default="out/demo.mp4",
                   help="annotated video to write (.mp4 H.264, .webm, or .avi; default %(default)s)")
    p.add_argument("--sink", action="append", default=None, metavar="URI",
                   help="extra output, repeatable (e.g. http://127.0.0.1:8080, jsonl://out/demo.jsonl)")
    p.add_argument("--max-frames", type=int, metavar="N",
                   help="stop after N frames (the full video has 795, the packaged cut 200)")
    p.add_argument("--backend", default="auto", help="backend (default: the best available)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for the backend (0: its default)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--files", metavar="DIR",
                   help="instead of running: write files to try the other commands on into DIR (an FP32 NanoDet "
                        "rebuilt from the packaged one, 8 photos, a labelled val set, the clip) and list them")
    p.set_defaults(func=run)


def find_assets() -> Path | None:
    """``$EDGERT_ASSETS``, else ``../shared/assets`` from the working directory or the project root."""
    env = os.environ.get("EDGERT_ASSETS")
    if env:
        return Path(env)
    project = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), project):
        candidate = base.parent / "shared" / "assets"
        if candidate.is_dir():
            return candidate
    return None


def packaged_data() -> Path:
    """The folder of the demo data inside the package (a plain folder: wheels and editable installs unpack)."""
    from edgert.demo_files import packaged_data as data

    return data()


def write_files(folder: str, as_json: bool) -> int:
    """``edgert demo --files DIR``: the demo files (:mod:`edgert.demo_files`) in DIR, and what each is for."""
    import json

    from edgert.demo_files import demo_files

    files = demo_files(folder)
    rows = {"model": (files.model, "FP32 NanoDet-m COCO, 416x416 (calibrate, convert, rebatch, val, run)"),
            "photos": (files.photos, f"{len(files.photo_paths())} frames of the clip (calibrate --images, run)"),
            "val_images": (files.val_images, "the same frames, labelled (val --images)"),
            "val_labels": (files.val_labels, "COCO labels of their people (val --labels)"),
            "video": (files.video, "20 s of the pedestrian clip, 384x288 (run --source)")}
    if as_json:
        print(json.dumps({k: str(v[0]) for k, v in rows.items()}, indent=2))
    else:
        for key, (path, what) in rows.items():
            print(f"{key:<11} {path}  {what}")
    return 0


def demo_inputs() -> tuple[Path, Path, str]:
    """Model, video and a line saying which data the demo uses: the full assets, else the packaged cut."""
    from edgert.errors import ConfigError

    assets = find_assets()
    if assets is not None and (assets / DEMO_MODEL).is_file() and (assets / DEMO_VIDEO).is_file():
        return assets / DEMO_MODEL, assets / DEMO_VIDEO, f"edgert: demo on the full assets in {assets}"
    if os.environ.get("EDGERT_ASSETS"):  # asked for, and not there: say so rather than quietly use less
        raise ConfigError(f"EDGERT_ASSETS={assets}: demo assets not found there (need {DEMO_MODEL} and "
                          f"{DEMO_VIDEO}). Note: unset EDGERT_ASSETS to run on the data the package carries")
    data = packaged_data()
    model, video = data / PACKAGED_MODEL, data / PACKAGED_VIDEO
    if not model.is_file() or not video.is_file():
        raise ConfigError(f"{data}: the packaged demo data is missing (need {PACKAGED_MODEL} and {PACKAGED_VIDEO}). "
                          "Note: reinstall edgert, or make them with scripts/make_demo_data.py")
    return model, video, (f"edgert: no ../shared/assets here; demo on the packaged data in {data} "
                          "(NanoDet with INT8 weights, a 20 s half-size cut of vtest.avi)")


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from edgert.cli.run import execute, format_summary
    from edgert.config import DecodeConfig, ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
    from edgert.errors import ConfigError

    if args.files:
        return write_files(args.files, args.json)
    model, video, which = demo_inputs()
    if args.max_frames is not None and args.max_frames < 1:
        raise ConfigError(f"--max-frames: expected a count >= 1, got {args.max_frames}")
    if args.threads is not None and args.threads < 0:
        raise ConfigError(f"--threads: expected a count >= 0, got {args.threads}")
    config = PipelineConfig(
        model=ModelConfig(path=str(model), backend=args.backend, threads=args.threads or 0),
        source=SourceConfig(uri=str(video)),
        decode=DecodeConfig(),  # run's defaults: the demo's numbers are what `edgert run` gives on the same clip
        sinks=(args.out, *(args.sink or ())),
        runtime=RuntimeConfig(max_frames=args.max_frames),
    )
    args.metrics = None
    args.progress_label = "demo"
    print(which, file=sys.stderr, flush=True)
    if Path(args.out).exists():
        print(f"edgert: {args.out} exists; the demo replaces it", file=sys.stderr, flush=True)
    summary = execute(config, args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
        print(f"annotated video: {args.out}")
    return 0
