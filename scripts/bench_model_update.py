#!/usr/bin/env python3
"""A model update on a running pipeline: what the background build costs the run, and the gap at the swap.

Two runs of the same pipeline (the shared video looped, a JSONL sink): one without an update, one with
``model.update_dir`` and the candidate dropped into it at ``--drop-at`` frames. From the second, the throughput
before the drop, while the candidate is built and checked (the child process at nice 19), and after the swap;
against the first run's throughput. The frame gap at the swap: the longest time between two finished frames
around the swap frame, against the median interval of the run without an update and one batch interval.

    python3 scripts/bench_model_update.py --out docs/results/model_update_cpu.json
    python3 scripts/bench_model_update.py --backend onnxruntime-cuda --processing gpu --out ...   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import ROOT, assets_dir, machine_info, write_json

from edgert.config import PipelineConfig
from edgert.config.convert import from_mapping
from edgert.pipeline import BaseObserver, Pipeline, PipelineStats


class Clock(BaseObserver):
    """When each frame finished, and the update's state then; drops the candidate at frame ``drop_at``."""

    def __init__(self, drop: tuple[Path, Path] | None, drop_at: int) -> None:
        self.times: list[float] = []
        self.states: list[str] = []
        self.drop, self.drop_at = drop, drop_at

    def on_frame(self, stats: PipelineStats) -> None:
        self.times.append(time.perf_counter())
        self.states.append(str((stats.model_update or {}).get("state", "")))
        if self.drop is not None and stats.frames == self.drop_at:
            model, folder = self.drop
            partial = folder / f".{model.name}.partial"
            shutil.copyfile(model, partial)
            partial.rename(folder / model.name)


def _fps(times: list[float]) -> float | None:
    return round((len(times) - 1) / (times[-1] - times[0]), 2) if len(times) > 1 and times[-1] > times[0] else None


def _run(args: argparse.Namespace, work: Path, update: bool) -> tuple[dict[str, Any], Clock, list[dict[str, Any]]]:
    model: dict[str, Any] = {"path": str(args.model), "backend": args.backend}
    if update:
        model["update_dir"] = str(work / "updates")
    config: PipelineConfig = from_mapping(PipelineConfig, {
        "model": model, "source": {"uri": str(args.video), "loop": True},
        "runtime": {"max_frames": args.frames, "processing": args.processing}})
    (work / "updates").mkdir(exist_ok=True)
    clock = Clock((Path(args.candidate), work / "updates") if update else None, args.drop_at)
    events = work / ("update.jsonl" if update else "plain.jsonl")
    summary = Pipeline(config, sinks=[f"jsonl://{events}"], observers=[clock], handle_signals=False).run()
    swaps = [r for r in map(json.loads, events.read_text().splitlines()) if r.get("type") == "model_swap"]
    return summary, clock, swaps


def main() -> int:
    assets = assets_dir()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(assets / "models/detection/nanodet-m-416-coco-v8layout.onnx"))
    packaged = ROOT / "edgert/demo_data/nanodet-m-416-int8w.onnx"  # the same detector, INT8 weights
    p.add_argument("--candidate", default=str(packaged))
    p.add_argument("--video", default=str(assets / "video/vtest.avi"))
    p.add_argument("--frames", type=int, default=1200)
    p.add_argument("--drop-at", type=int, default=100)
    p.add_argument("--backend", default="onnxruntime")
    p.add_argument("--processing", default="auto")
    p.add_argument("--out", help="write the JSON here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plain, base, _ = _run(args, work, update=False)
        summary, clock, swaps = _run(args, work, update=True)
    intervals = [b - a for a, b in zip(base.times, base.times[1:])]
    median_ms = 1000 * statistics.median(intervals) if intervals else None
    batch = int(summary.get("batch") or 1)
    building = [t for t, s in zip(clock.times, clock.states) if s in ("queued", "building", "checking")]
    result: dict[str, Any] = {
        "model": args.model, "candidate": args.candidate, "frames": args.frames, "drop_at": args.drop_at,
        "backend": summary.get("backend"), "processing": summary.get("processing"), "batch": batch,
        "fps_without_update": plain.get("fps"), "fps_with_update": summary.get("fps"),
        "fps_before_drop": _fps(clock.times[:args.drop_at]), "fps_during_build": _fps(building),
        "build_s": round(building[-1] - building[0], 2) if len(building) > 1 else None,
        "update": summary.get("model_update"), "machine": machine_info(),
    }
    if swaps:
        at = int(swaps[0]["frame"])
        around = clock.times[max(0, at - 10):at + 10]
        gap_ms = 1000 * max(b - a for a, b in zip(around, around[1:]))
        # the same measure anywhere in the run without an update: the longest interval of each 20-frame window
        windows = [max(intervals[k:k + 19]) for k in range(0, len(intervals) - 19, 10)]
        result.update(swap_frame=at, fps_after_swap=_fps(clock.times[at:]), gap_at_swap_ms=round(gap_ms, 2),
                      window_max_ms_without_update={
                          "median": round(1000 * statistics.median(windows), 2) if windows else None,
                          "p95": round(1000 * sorted(windows)[int(0.95 * (len(windows) - 1))], 2) if windows else None},
                      median_interval_ms=round(median_ms, 2) if median_ms else None,
                      gap_over_batch_interval=round(gap_ms / (median_ms * batch), 2) if median_ms else None)
    else:
        result["swap_frame"] = None  # not swapped within --frames: the figures after it are missing
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1, default=str))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
