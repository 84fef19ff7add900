"""``edgert demo``: the main job in one command, on the bundled assets.

NanoDet (COCO) on ``video/vtest.avi`` with the best backend this machine has, writing an annotated
video (``out/demo.mp4`` by default) and printing the run's summary. The assets are found through
``EDGERT_ASSETS`` or ``../shared/assets`` beside the working directory or the project.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

DEMO_MODEL = "models/detection/nanodet-m-416-coco-v8layout.onnx"
DEMO_VIDEO = "video/vtest.avi"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="detect people in the sample video with NanoDet and write an annotated video",
        description="NanoDet COCO on the assets' video/vtest.avi with the best backend available; writes an "
                    "annotated video and prints the summary. Needs the assets (EDGERT_ASSETS or ../shared/assets).",
    )
    p.add_argument("--out", default="out/demo.mp4", help="annotated video to write (.mp4 or .avi; default %(default)s)")
    p.add_argument("--sink", action="append", default=None, metavar="URI",
                   help="extra output, repeatable (e.g. http://127.0.0.1:8080, jsonl://out/demo.jsonl)")
    p.add_argument("--max-frames", type=int, metavar="N", help="stop after N frames (the video has 795)")
    p.add_argument("--backend", default="auto", help="backend (default: the best available)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for the backend (0: its default)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
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


def run(args: argparse.Namespace) -> int:
    import json

    from edgert.cli.run import execute, format_summary
    from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
    from edgert.errors import ConfigError

    assets = find_assets()
    if assets is None or not (assets / DEMO_MODEL).is_file() or not (assets / DEMO_VIDEO).is_file():
        where = str(assets) if assets is not None else "../shared/assets"
        raise ConfigError(
            f"demo assets not found in {where} (need {DEMO_MODEL} and {DEMO_VIDEO}). "
            "Note: set EDGERT_ASSETS to the assets folder"
        )
    if args.max_frames is not None and args.max_frames < 1:
        raise ConfigError(f"--max-frames: expected a count >= 1, got {args.max_frames}")
    if args.threads is not None and args.threads < 0:
        raise ConfigError(f"--threads: expected a count >= 0, got {args.threads}")
    config = PipelineConfig(
        model=ModelConfig(path=str(assets / DEMO_MODEL), backend=args.backend, threads=args.threads or 0),
        source=SourceConfig(uri=str(assets / DEMO_VIDEO)),
        sinks=(args.out, *(args.sink or ())),
        runtime=RuntimeConfig(max_frames=args.max_frames),
    )
    args.metrics = None
    summary = execute(config, args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
        print(f"annotated video: {args.out}")
    return 0
