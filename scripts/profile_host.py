#!/usr/bin/env python3
"""The pipeline's own host cost per frame, with the engine made negligible: Python calls and CPU per frame.

A tiny real detector (a 32x32 stride-8 convolution, ONNX Runtime on the CPU, one box per frame) on N copies of
a small real video, batch N, so what the run's process spends is the pipeline itself: capture hand-off,
batching, the slots' host steps, the result path (stages, sinks, statistics). Two passes:

1. plain: the main process's CPU seconds (all its threads, not the capture workers) per frame, and each
   pipeline thread's own (``time.thread_time``) summed by role;
2. profiled: a ``cProfile`` per pipeline thread, merged by role (capture, batcher, slot, results, other):
   Python function calls per frame and the top entries by own time.

Frames per second here say nothing about a GPU; the calls per frame are what the interpreter lock serialises
there (docs/pipeline.md, issue 28).

    python3 scripts/profile_host.py --streams 16 --frames 200 --out host.json [--capture process] [--track]
                                    [--observers 2]

``--observers N`` adds N observers shaped like the run's own power and telemetry ones (a count test per frame,
or ``on_frames`` per batch where the pipeline has it): what an ``edgert run`` on a machine with a power meter and
GPU telemetry carries, which this CPU box does not.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _bench import ROOT, machine_info, write_json

sys.path.insert(0, str(ROOT))  # tests.pipeline.media: the tiny detector and video the tests use


def _role(name: str) -> str:
    for role in ("capture", "batcher", "slot", "results", "track"):
        if role in name:
            return role
    return "other"


class _EveryFewFrames:
    """Like hooks.PowerWatts without a meter: a count test per frame (``on_frame``) or per batch (``on_frames``)."""

    def __init__(self) -> None:
        self.every, self.seen, self.refreshes = 160, 0, 0

    def on_start(self, info: Any) -> None:
        pass

    def on_frame(self, stats: Any) -> None:
        if stats.frames % self.every == 1:
            self.refreshes += 1
        self.seen = stats.frames

    def on_frames(self, stats: Any) -> None:
        seen, self.seen = self.seen, stats.frames
        if stats.frames > seen and (stats.frames - 1) // self.every != (seen - 1) // self.every:
            self.refreshes += 1

    def on_stop(self, summary: Any) -> None:
        pass


def _config(model: Path, video: Path, streams: int, frames: int, capture: str, track: bool) -> Any:
    from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig, TrackConfig

    sources = tuple(SourceConfig(uri=str(video), loop=True, capture=capture) for _ in range(streams))
    return PipelineConfig(model=ModelConfig(path=str(model)), sources=sources,
                          runtime=RuntimeConfig(max_frames=frames, batch=streams),
                          track=TrackConfig() if track else None)


def _run(config: Any, profile: bool, observers: int = 0
         ) -> tuple[dict[str, Any], float, float, dict[str, pstats.Stats], dict[str, float]]:
    from edgert.pipeline.runner import Pipeline

    profiles: list[tuple[str, cProfile.Profile]] = []
    thread_cpu: dict[str, float] = {}  # role -> CPU seconds of its threads (time.thread_time, the plain pass)
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        p = cProfile.Profile()
        profiles.append((self.name, p))
        p.enable()
        try:
            original(self)
        finally:
            p.disable()

    def timed(self: threading.Thread) -> None:
        t0 = time.thread_time()
        try:
            original(self)
        finally:
            role = _role(self.name)
            thread_cpu[role] = thread_cpu.get(role, 0.0) + time.thread_time() - t0

    threading.Thread.run = run if profile else timed  # type: ignore[method-assign]
    try:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        summary = Pipeline(config, observers=[_EveryFewFrames() for _ in range(observers)], handle_signals=False,
                           environment=False).run()
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        threading.Thread.run = original  # type: ignore[method-assign]
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    by_role: dict[str, pstats.Stats] = {}
    for name, p in profiles:
        role = _role(name)
        if role in by_role:
            by_role[role].add(p)
        else:
            by_role[role] = pstats.Stats(p)
    return summary, wall, cpu, by_role, thread_cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--frames", type=int, default=200, help="frames per stream")
    ap.add_argument("--capture", default="process", help="source.capture for every stream")
    ap.add_argument("--track", action="store_true", help="ByteTrack on every stream")
    ap.add_argument("--observers", type=int, default=0, help="observers like the power and telemetry ones")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", default="profile_host.json")
    args = ap.parse_args()
    from tests.pipeline.media import make_video, tiny_detector

    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_detector(Path(tmp) / "tiny.onnx", dynamic_batch=True)
        video = make_video(Path(tmp) / "v.avi", frames=50, size=(160, 120))
        config = _config(model, video, args.streams, args.frames, args.capture, args.track)
        summary, wall, cpu, _, thread_cpu = _run(config, profile=False, observers=args.observers)
        frames = summary["frames"]
        _, _, _, roles, _ = _run(config, profile=True, observers=args.observers)
    result: dict[str, Any] = {
        "machine": machine_info(), "streams": args.streams, "frames": frames, "capture": args.capture,
        "track": args.track, "observers": args.observers, "batch": summary.get("batch"), "wall_s": round(wall, 2),
        "fps": summary["fps"],
        "main_cpu_us_per_frame": round(cpu / frames * 1e6, 1),
        "thread_cpu_us_per_frame": {role: round(t / frames * 1e6, 1) for role, t in sorted(thread_cpu.items())},
        "roles": {}}
    print(f"{args.streams} streams, {frames} frames, batch {summary.get('batch')}, capture {args.capture}, "
          f"track {args.track}: main process {cpu / frames * 1e6:.0f} us CPU per frame ({summary['fps']} fps here)")
    total = 0.0
    for role, stats in sorted(roles.items()):
        calls = stats.total_calls  # type: ignore[attr-defined]
        total += calls / frames
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[: args.top]  # type: ignore[attr-defined]
        top = [{"function": f"{Path(f).name}:{line} {fn}", "calls_per_frame": round(nc / frames, 2),
                "own_us_per_frame": round(tt / frames * 1e6, 1)} for (f, line, fn), (_, nc, tt, _, _) in rows]
        by_calls = sorted(stats.stats.items(), key=lambda kv: -kv[1][1])[: args.top]  # type: ignore[attr-defined]
        most = [{"function": f"{Path(f).name}:{line} {fn}", "calls_per_frame": round(nc / frames, 2)}
                for (f, line, fn), (_, nc, _, _, _) in by_calls]
        result["roles"][role] = {"calls_per_frame": round(calls / frames, 1), "top": top, "most_called": most}
        cpu_us = thread_cpu.get(role, 0.0) / frames * 1e6
        print(f"  {role:8s} {calls / frames:8.1f} calls/frame {cpu_us:8.1f} us CPU/frame (unprofiled pass)")
        for row in top[:6]:
            print(f"           {row['calls_per_frame']:7.2f}  {row['own_us_per_frame']:7.1f} us  {row['function']}")
    result["calls_per_frame"] = round(total, 1)
    print(f"  all      {total:8.1f} calls/frame")
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
