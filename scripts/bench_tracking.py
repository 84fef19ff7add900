#!/usr/bin/env python3
"""What tracking and analytics cost per frame on the CPU, on real detections of vtest.avi.

1. runs the detector (NanoDet by default) over the video once and keeps every frame's detections
   (``--cache FILE.npz`` keeps them between runs, so only step 2 repeats);
2. times, per frame, each tracker asked for (``--trackers bytetrack,sort``) alone and then with the
   analytics (a counting line across the middle of the frame and a zone on its lower half), over
   ``--repeats`` passes, and reports the median of each pass's mean and the p95 over all frames;
3. checks what the issue asks of tracking on this video: every detection has a track id, the mean track
   length, crossing events.

Prints a table and writes ``--out`` (JSON): wall-clock ms per frame (mean, p95) and the thread's CPU ms
per frame (steadier than wall clock on a loaded machine); "kept" is the share of detections a track
claimed. Single-threaded Python, to compare against the per-frame budget (33 ms at 30 fps).

    .venv/bin/python scripts/bench_tracking.py --out out/bench_tracking.json
    .venv/bin/python scripts/bench_tracking.py --frames 300 --repeats 5 --cache /tmp/vtest-dets.npz
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _bench import assets_dir, machine_info

from edgert.analytics import Analytics, Tracker
from edgert.config import AnalyticsConfig, DecodeConfig, LineConfig, PipelineConfig, TrackConfig, ZoneConfig
from edgert.vision.detections import Detections


def detect_video(model: str, video: str, frames: int, conf: float) -> tuple[list[Detections], tuple[int, int]]:
    """Every frame's detections (up to ``frames``) and the frame size (width, height)."""
    from edgert.io.sources import open_source
    from edgert.vision.detector import Detector

    config = PipelineConfig(decode=DecodeConfig(conf=conf))
    out: list[Detections] = []
    with Detector(model, config, backend="onnxruntime") as detector, open_source(video) as source:
        size = (source.width, source.height)
        while len(out) < frames:
            frame = source.read()
            if frame is None:
                break
            out.append(detector(frame))
    return out, size


def save(path: Path, dets: list[Detections], size: tuple[int, int]) -> None:
    arrays: dict[str, Any] = {"size": np.array(size), "names": np.array(dets[0].names if dets else ())}
    for i, d in enumerate(dets):
        arrays[f"b{i}"], arrays[f"c{i}"], arrays[f"k{i}"] = d.xyxy, d.confidence, d.class_id
    np.savez_compressed(path, count=len(dets), **arrays)


def load(path: Path) -> tuple[list[Detections], tuple[int, int]]:
    z = np.load(path)
    names = tuple(str(n) for n in z["names"].tolist())
    dets = [Detections(z[f"b{i}"], z[f"c{i}"], z[f"k{i}"], names) for i in range(int(z["count"]))]
    w, h = (int(v) for v in z["size"].tolist())
    return dets, (w, h)


def analytics_for(width: int, height: int) -> AnalyticsConfig:
    """A counting line across the middle of the frame and a zone on its lower half."""
    mid = height / 2
    line = LineConfig(name="middle", points=((0.0, mid), (float(width), mid)), classes=("person",))
    zone = ZoneConfig(name="lower", polygon=((0.0, mid), (float(width), mid), (float(width), float(height)),
                                             (0.0, float(height))))
    return AnalyticsConfig(lines=(line,), zones=(zone,))


def run_once(dets: list[Detections], track: TrackConfig, analytics: AnalyticsConfig | None,
             fps: float) -> dict[str, Any]:
    tracker = Tracker.from_config(track, fps)
    counter = Analytics(analytics) if analytics is not None else None
    times = np.zeros(len(dets))
    cpu = np.zeros(len(dets))
    events: list[dict[str, Any]] = []
    tracked_boxes = untracked = 0
    for i, d in enumerate(dets):
        t0, c0 = time.perf_counter(), time.thread_time()
        out = tracker.update(d, i, i / fps)
        if counter is not None:
            events.extend(counter.update(out, i, i / fps))
        times[i] = time.perf_counter() - t0
        cpu[i] = time.thread_time() - c0
        tracked_boxes += len(out)
        untracked += int(np.count_nonzero(out.track_id < 0)) if out.track_id is not None else len(out)
    summary = tracker.summary()
    return {"times": times, "cpu": cpu, "events": events, "summary": summary, "tracked_boxes": tracked_boxes,
            "untracked": untracked, "counts": counter.counts() if counter is not None else None}


def main() -> int:
    assets = assets_dir()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(assets / "models/detection/nanodet-m-416-coco-v8layout.onnx"))
    ap.add_argument("--video", default=str(assets / "video/vtest.avi"))
    ap.add_argument("--frames", type=int, default=795)
    ap.add_argument("--conf", type=float, default=0.35)
    ap.add_argument("--fps", type=float, default=10.0, help="the video's rate (vtest.avi: 10)")
    ap.add_argument("--trackers", default="bytetrack,sort")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", help="npz of detections: read when present, else written")
    ap.add_argument("--out", default="out/bench_tracking.json")
    args = ap.parse_args()

    t0 = time.perf_counter()
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.exists():
        dets, size = load(cache)
        dets = dets[: args.frames]
    else:
        dets, size = detect_video(args.model, args.video, args.frames, args.conf)
        if cache is not None:
            save(cache, dets, size)
    detect_s = time.perf_counter() - t0
    boxes = sum(len(d) for d in dets)
    print(f"{len(dets)} frames, {boxes} detections ({detect_s:.1f} s to detect or load), frame {size[0]}x{size[1]}")

    analytics = analytics_for(*size)
    results: dict[str, Any] = {}
    print(f"{'tracker':<10} {'what':<22} {'mean ms':>8} {'cpu ms':>8} {'p95 ms':>8} {'tracks':>7} {'mean len':>9} "
          f"{'kept':>6} {'events':>7}")
    for name in args.trackers.split(","):
        track = TrackConfig(tracker=name.strip())
        for label, an in (("tracking", None), ("tracking + analytics", analytics)):
            means, cpu_means, all_times, last = [], [], [], None
            for _ in range(args.repeats):
                last = run_once(dets, track, an, args.fps)
                means.append(float(np.mean(last["times"])) * 1e3)
                cpu_means.append(float(np.mean(last["cpu"])) * 1e3)
                all_times.append(last["times"])
            assert last is not None
            p95 = float(np.percentile(np.concatenate(all_times), 95)) * 1e3
            row = {
                "mean_ms": round(statistics.median(means), 4), "p95_ms": round(p95, 4),
                "cpu_ms": round(statistics.median(cpu_means), 4),
                "means_ms": [round(m, 4) for m in means],
                "tracks": last["summary"]["tracks"], "mean_track_frames": last["summary"]["mean_track_frames"],
                "tracked_boxes": last["tracked_boxes"], "untracked_boxes": last["untracked"],
                "line_cross_events": sum(e["type"] == "line_cross" for e in last["events"]),
                "zone_events": sum(e["type"].startswith("zone_") for e in last["events"]),
                "counts": last["counts"],
            }
            results[f"{name}/{label}"] = row
            kept = row["tracked_boxes"] / max(boxes, 1)
            print(f"{name:<10} {label:<22} {row['mean_ms']:>8.3f} {row['cpu_ms']:>8.3f} {row['p95_ms']:>8.3f} "
                  f"{row['tracks']:>7} {row['mean_track_frames']:>9.1f} {kept:>6.1%} "
                  f"{row['line_cross_events'] + row['zone_events']:>7}")
    key = f"{args.trackers.split(',')[0]}/tracking + analytics"
    first = results[key]
    print(f"{key}: every kept detection has a track id: {first['untracked_boxes'] == 0}; "
          f"mean track length {first['mean_track_frames']} frames; {first['line_cross_events']} crossings; "
          f"counts {json.dumps(first['counts'])}")
    report = {
        "frames": len(dets), "detections": boxes, "frame_size": list(size), "conf": args.conf, "fps": args.fps,
        "machine": machine_info(),
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
