#!/usr/bin/env python3
"""Many cameras, one engine, on a GPU machine: N live-decoded streams batched through one model.

For each model (the batch dimension made dynamic by edgert's checked rewrite where the export fixed it at 1):

1. ``edgert run --backend onnxruntime-cuda --model M --source vtest.avi`` x N (N = 1, 2, 4, 8), each source
   decoded live by its own OpenCV capture, ``--loop --max-frames F`` per source, batch = N (the default):
   aggregate FPS, per-stream FPS, per-frame latency p50/p99 (capture to sinks), watts and mJ per frame;
2. the check: 4 streams batched vs one stream alone, first 60 frames: same classes and boxes within 1 px per
   frame of stream 0.

Compute-only batch throughput is ``scripts/bench_batch_gpu.py`` (run beside this, same machine).

    python3 scripts/bench_many_streams.py --out many_streams.json [--streams 1,2,4,8] [--frames 1500]
    python3 scripts/bench_many_streams.py --run-args "--memory zero-copy --slots 4" --batch-per-stream 2 --no-check
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _bench import assets_dir, machine_info, write_json

MODELS = ("yolov8s-fall-640.onnx", "nanodet-m-416-coco-v8layout.onnx")


def run(model: Path, video: Path, streams: int, frames: int, backend: str = "onnxruntime-cuda",
        extra: Sequence[str] = (), batch_per_stream: int = 0) -> dict[str, Any]:
    sources = [a for _ in range(streams) for a in ("--source", str(video))]
    batch = ["--batch", str(batch_per_stream * streams)] if batch_per_stream else []
    cmd = [sys.executable, "-m", "edgert.cli.main", "run", "--backend", backend, "--model", str(model),
           *sources, "--loop", "--max-frames", str(frames), "--json", *batch, *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    s = json.loads(proc.stdout)
    total = s["latency_ms"]["total"]
    return {"streams": streams, "batch": s.get("batch"), "processing": s.get("processing"), "slots": s.get("slots"),
            "memory": (s.get("processor") or {}).get("memory"),
            "frames": s["frames"], "aggregate_fps": s["fps"],
            "per_stream_fps": [src["fps"] for src in s["sources"]],
            "latency_p50_ms": total["p50"], "latency_p99_ms": total["p99"],
            "watts": s.get("watts"), "mj_per_frame": s.get("mj_per_frame"), "drops": s.get("drops"),
            "batch_note": s.get("batch_note"), "gpu_ms_infer_p50": (s.get("gpu_ms") or {}).get("infer", {}).get("p50"),
            "wall_s": round(time.perf_counter() - t0, 1)}


def check(model: Path, video: Path, frames: int = 60, backend: str = "onnxruntime-cuda") -> dict[str, Any]:
    """Stream 0 of a 4-stream batched run against the same video alone: per frame, same boxes (1 px)."""
    with tempfile.TemporaryDirectory() as tmp:
        many = Path(tmp) / "many-{source}.jsonl"
        alone = Path(tmp) / "alone.jsonl"
        base = [sys.executable, "-m", "edgert.cli.main", "run", "--backend", backend, "--model", str(model),
                "--max-frames", str(frames)]
        for cmd in ([*base, *[a for _ in range(4) for a in ("--source", str(video))], "--sink", f"jsonl://{many}"],
                    [*base, "--source", str(video), "--sink", f"jsonl://{alone}"]):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip()[-800:])
        a = [json.loads(x) for x in alone.read_text().splitlines()]
        b = [json.loads(x) for x in Path(str(many).replace("{source}", "0")).read_text().splitlines()]
    worst, same = 0.0, True
    for ra, rb in zip(a, b):
        da, db = ra["detections"], rb["detections"]
        if len(da) != len(db) or sorted(d["class_id"] for d in da) != sorted(d["class_id"] for d in db):
            same = False
            continue
        for d in da:
            diff = min(max(abs(x - y) for x, y in zip(d["box"], e["box"])) for e in db) if db else 0.0
            worst = max(worst, diff)
    return {"frames": min(len(a), len(b)), "same_counts_and_classes": same, "max_box_diff_px": worst,
            "within_1px": same and worst <= 1.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="many_streams.json")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--frames", type=int, default=1500, help="frames per stream")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--backend", default="onnxruntime-cuda", help="onnxruntime for a quick check on a CPU machine")
    ap.add_argument("--check-frames", type=int, default=60)
    ap.add_argument("--run-args", default="", help="more `edgert run` arguments for every row, e.g. "
                    "\"--memory zero-copy --slots 4\"")
    ap.add_argument("--batch-per-stream", type=int, default=0,
                    help="--batch = this x streams (default: edgert's own, one frame per stream)")
    ap.add_argument("--no-check", action="store_true", help="skip the batched-vs-alone check")
    args = ap.parse_args()
    extra = shlex.split(args.run_args)
    assets = assets_dir()
    video = assets / "video" / "vtest.avi"
    results: dict[str, Any] = {"machine": machine_info(), "frames_per_stream": args.frames, "run_args": extra,
                               "batch_per_stream": args.batch_per_stream or None}
    for name in args.models:
        model = assets / "models" / "detection" / name
        key = name.split("-")[0]
        rows = []
        for n in (int(x) for x in args.streams.split(",")):
            try:
                rows.append(run(model, video, n, args.frames, args.backend, extra, args.batch_per_stream))
            except Exception as exc:  # one failing row must not lose the others
                rows.append({"streams": n, "error": str(exc)})
            print(f"{key}: {json.dumps(rows[-1])}", flush=True)
            results[key] = {"rows": rows}
            write_json(args.out, results)
        if not args.no_check:
            try:
                results[key]["check"] = check(model, video, args.check_frames, args.backend)
            except Exception as exc:
                results[key]["check"] = {"error": str(exc)}
            print(f"{key} check: {results[key]['check']}", flush=True)
        one = next((r for r in rows if r.get("streams") == 1 and "aggregate_fps" in r), None)
        for r in rows:
            if one and "aggregate_fps" in r:
                r["over_one_stream"] = round(r["aggregate_fps"] / one["aggregate_fps"], 2)
        write_json(args.out, results)
    print("| model | streams | batch | aggregate fps | x one stream | p50 ms | p99 ms | W | mJ/frame |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        key = name.split("-")[0]
        for r in results.get(key, {}).get("rows", []):
            if "aggregate_fps" in r:
                w = r["watts"] if r["watts"] is None else round(r["watts"], 1)
                mj = r["mj_per_frame"] if r["mj_per_frame"] is None else round(r["mj_per_frame"], 1)
                print(f"| {key} | {r['streams']} | {r['batch']} | {r['aggregate_fps']} | {r.get('over_one_stream')} | "
                      f"{r['latency_p50_ms']} | {r['latency_p99_ms']} | {w} | {mj} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
