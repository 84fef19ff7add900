#!/usr/bin/env python3
"""What tracking costs the results thread at many sources, in-process and in worker processes (``track.workers``).

Real NanoDet detections of vtest.avi (``--cache FILE.npz`` as in scripts/bench_tracking.py), each of N sources
starting at its own frame, go through the step the results thread runs on each batch (one frame per source):
ByteTrack + a counting line + a zone. ``--workers 0`` is the in-process path (:func:`run_stages` per frame);
K > 0 is :meth:`TrackingWorkers.apply` with K processes. Reported per frame: the results thread's own CPU (what
holds the interpreter lock the slot threads wait for: the critical path), the CPU of the worker processes, and
the frames/s of that step alone. Prints a table and writes ``--out`` (JSON).

    nice -n 10 .venv/bin/python scripts/bench_tracking_workers.py --sources 16,32 --workers 0,2,4 \\
        --cache /tmp/vtest-dets.npz --out docs/results/bench-tracking-workers-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _bench import assets_dir, machine_info
from bench_tracking import analytics_for, detect_video, load, save

from edgert.analytics.stages import make_result_stages, run_stages
from edgert.analytics.workers import TrackingWorkers
from edgert.config import PipelineConfig, TrackConfig
from edgert.pipeline.feeds import _Feed, _Frame
from edgert.pipeline.state import RunState
from edgert.stats import PipelineStats
from edgert.vision.detections import Detections

_TICK = os.sysconf("SC_CLK_TCK")


class _Clip:
    """What the stages read of a source: its rate and frame size (the frames come from the cache)."""

    def __init__(self, fps: float, size: tuple[int, int]) -> None:
        self.fps, self.width, self.height, self.uri = fps, size[0], size[1], "vtest.avi"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def run(dets: list[Detections], size: tuple[int, int], sources: int, workers: int, batches: int,
        fps: float) -> dict[str, Any]:
    config = PipelineConfig(track=TrackConfig(workers=workers), analytics=analytics_for(*size))
    state = RunState(config, PipelineStats(), [], lambda _: None, lambda _: None, lambda *_: None)
    state.names = dets[0].names
    state.feeds = [_Feed(i, str(i), _Clip(fps, size)) for i in range(sources)]  # type: ignore[arg-type]
    for feed in state.feeds:
        feed.stages = make_result_stages(config, fps, size, state.names, feed.name)
    pool = TrackingWorkers(config, state.names, workers, sources) if workers else None
    if pool is not None:
        state.tracking = pool
        for feed in state.feeds:
            feed.stages = pool.adopt(feed.index, feed.name, fps, size, feed.stages)
    step = len(dets) // sources  # each source starts at its own place in the video
    frames = [[_Frame(index=b, feed=s, media_time=b / fps, detections=dets[(s * step + b) % len(dets)])
               for s in range(sources)] for b in range(batches)]
    tracks = 0
    try:
        before = [_cpu_s(p) for p in pool.pids()] if pool else []
        cpu0, t0 = time.thread_time(), time.perf_counter()
        for batch in frames:
            if pool is not None:
                out = pool.apply(batch)
            else:
                out = [run_stages(state.feeds[f.feed].stages, f.detections, f.index, f.media_time)  # type: ignore[arg-type]
                       for f in batch]
            tracks += sum(len(d) for d, _ in out)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - t0
        worker_cpu = sum(_cpu_s(p) for p in pool.pids()) - sum(before) if pool else 0.0
    finally:
        if pool is not None:
            pool.close()
    n = sources * batches
    return {"sources": sources, "workers": workers, "frames": n, "frames_per_s": round(n / wall, 1),
            "results_thread_cpu_ms_per_frame": round(cpu / n * 1e3, 4),
            "workers_cpu_ms_per_frame": round(worker_cpu / n * 1e3, 4),
            "tracked_boxes": tracks, "summary_source0": state.feeds[0].stages[0].summary()}


def main() -> int:
    assets = assets_dir()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(assets / "models/detection/nanodet-m-416-coco-v8layout.onnx"))
    ap.add_argument("--video", default=str(assets / "video/vtest.avi"))
    ap.add_argument("--frames", type=int, default=795, help="frames of the video to detect (or load)")
    ap.add_argument("--batches", type=int, default=150, help="batches (one frame per source) to time")
    ap.add_argument("--sources", default="16,32")
    ap.add_argument("--workers", default="0,2,4")
    ap.add_argument("--fps", type=float, default=10.0)
    ap.add_argument("--cache", help="npz of detections: read when present, else written")
    ap.add_argument("--out", default="out/bench_tracking_workers.json")
    args = ap.parse_args()
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.exists():
        dets, size = load(cache)
    else:
        dets, size = detect_video(args.model, args.video, args.frames, 0.35)
        if cache is not None:
            save(cache, dets, size)
    rows = []
    print(f"{'sources':>7} {'workers':>7} {'frames/s':>9} {'results-thread CPU ms/frame':>28} "
          f"{'workers CPU ms/frame':>21}")
    for sources in (int(s) for s in args.sources.split(",")):
        for workers in (int(w) for w in args.workers.split(",")):
            row = run(dets, size, sources, workers, args.batches, args.fps)
            rows.append(row)
            print(f"{sources:>7} {workers:>7} {row['frames_per_s']:>9} {row['results_thread_cpu_ms_per_frame']:>28} "
                  f"{row['workers_cpu_ms_per_frame']:>21}")
    load_avg = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine_info(), "load_avg": load_avg, "rows": rows,
                                          "argv": sys.argv[1:]}, indent=1))
    print(f"load average {load_avg[0]:.2f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
