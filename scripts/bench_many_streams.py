#!/usr/bin/env python3
"""Many cameras, one engine, on a GPU machine: N live-decoded streams batched through one model (issues 13, 28).

For each model (the batch dimension made dynamic by edgert's checked rewrite where the export fixed it at 1),
each stream count N (default 1, 4, 8, 16, 32), without and with tracking (``--tracking off,on``):

1. ``edgert run --backend onnxruntime-cuda --model M --source vtest.avi`` x N, ``--loop --max-frames F`` per
   source, batch = N and capture as edgert chooses (``source.capture: auto``: worker processes from 4 sources
   on a host of 4+ cores): aggregate FPS, x one stream, / compute-only at the same batch (``--compute``),
   per-stream FPS and their spread (max / min - 1), per-frame latency p50/p99 (capture to sinks), watts and
   mJ per frame, and the host CPU it took: the CPU time of the run's whole process tree (capture workers
   included), sampled from /proc every 0.25 s, over the steady middle of the run (the last 0.5 s before
   exit dropped, then 70 % of the frames' duration; an interval in which a worker exited is left out), as
   cores and as a share of one core per stream;
2. the check: 4 streams batched vs one stream alone, first 60 frames: same classes and boxes within 1 px per
   frame of stream 0.

``--compute`` first runs ``scripts/bench_batch_gpu.py`` at the same batch sizes (compute-only, one session,
same machine) so each row gets its ``/ compute-only`` ratio.

    python3 scripts/bench_many_streams.py --out many_streams.json --compute [--streams 1,4,8,16,32] [--frames 300]
    python3 scripts/bench_many_streams.py --run-args "--capture thread" --tracking off --no-check
    python3 scripts/bench_many_streams.py --run-args "--realtime --stagger" --streams 1,16   # cameras out of step
    python3 scripts/bench_many_streams.py --backend onnxruntime --models nanodet-m-416-coco-v8layout.onnx \
        --streams 1,4 --frames 20 --no-check          # a quick check on a CPU machine
"""

from __future__ import annotations

import argparse
import json
import os
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
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every descendant alive now (Linux /proc)."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(x) for x in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue  # gone between listing and reading
    return total


def _steady_cores(samples: list[tuple[float, float]], frames_s: float) -> float | None:
    """Cores used over the steady middle: the window ending 0.5 s before the last sample, 70 % of ``frames_s``."""
    if len(samples) < 3 or frames_s <= 0:
        return None
    end_t = samples[-1][0] - 0.5
    start_t = end_t - 0.7 * frames_s
    inside = [s for s in samples if start_t <= s[0] <= end_t]
    # Intervals where the tree's total fell (a worker exited and took its CPU time with it) are left out.
    steps = [(t1 - t0, c1 - c0) for (t0, c0), (t1, c1) in zip(inside, inside[1:]) if c1 >= c0]
    span = sum(dt for dt, _ in steps)
    if span < 0.2:
        return None
    return sum(dc for _, dc in steps) / span


def run(model: Path, video: Path, streams: int, frames: int, backend: str = "onnxruntime-cuda",
        extra: Sequence[str] = (), batch_per_stream: int = 0, track: bool = False) -> dict[str, Any]:
    sources = [a for _ in range(streams) for a in ("--source", str(video))]
    batch = ["--batch", str(batch_per_stream * streams)] if batch_per_stream else []
    cmd = [sys.executable, "-m", "edgert.cli.main", "run", "--backend", backend, "--model", str(model),
           *sources, "--loop", "--max-frames", str(frames), "--json", *batch, *(["--track"] if track else []), *extra]
    t0 = time.perf_counter()
    samples: list[tuple[float, float]] = []
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        while proc.poll() is None:
            samples.append((time.perf_counter(), _tree_cpu_s(proc.pid)))
            if time.perf_counter() - t0 > 600:
                proc.kill()
            time.sleep(0.25)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {stderr.strip()[-800:]}")
    s = json.loads(stdout)
    total = s["latency_ms"]["total"]
    per = [src["fps"] for src in s["sources"]]
    cores = _steady_cores(samples, s["frames"] / s["fps"] if s["fps"] else 0.0)
    return {"streams": streams, "tracking": track, "batch": s.get("batch"), "processing": s.get("processing"),
            "slots": s.get("slots"), "slots_rule": (s.get("processor") or {}).get("slots_rule"),
            "memory": (s.get("processor") or {}).get("memory"),
            "tracking_workers": s.get("tracking_workers"),
            "capture": sorted({str(src.get("capture") or "?") for src in s["sources"]}),
            "frames": s["frames"], "aggregate_fps": s["fps"], "per_stream_fps": per,
            "per_stream_spread": round(max(per) / min(per) - 1, 3) if per and min(per) > 0 else None,
            "latency_p50_ms": total["p50"], "latency_p99_ms": total["p99"],
            "stages_p50_ms": {k: v.get("p50") for k, v in s["latency_ms"].items() if k != "total"},
            "frames_in_flight": s.get("frames_in_flight"),
            "batches": s.get("batches"), "batch_fill": s.get("batch_fill"),
            "batch_sizes": (s.get("processor") or {}).get("batch_sizes"),
            "calls_at": (s.get("processor") or {}).get("calls_at"),
            "warmup_s": (s.get("processor") or {}).get("warmup_s"),
            "watts": s.get("watts"), "mj_per_frame": s.get("mj_per_frame"), "drops": s.get("drops"),
            "host_cpu_cores": None if cores is None else round(cores, 2),
            "host_cpu_per_stream": None if cores is None else round(cores / streams, 3),
            "batch_note": s.get("batch_note"), "gpu_ms_infer_p50": (s.get("gpu_ms") or {}).get("infer", {}).get("p50"),
            "gpu_ms_p50": {k: v.get("p50") for k, v in (s.get("gpu_ms") or {}).items()},
            "wall_s": round(time.perf_counter() - t0, 1)}


def check(model: Path, video: Path, frames: int = 60, backend: str = "onnxruntime-cuda",
          extra: Sequence[str] = ()) -> dict[str, Any]:
    """Stream 0 of a 4-stream batched run against the same video alone: per frame, same boxes (1 px)."""
    with tempfile.TemporaryDirectory() as tmp:
        many = Path(tmp) / "many-{source}.jsonl"
        alone = Path(tmp) / "alone.jsonl"
        base = [sys.executable, "-m", "edgert.cli.main", "run", "--backend", backend, "--model", str(model),
                "--max-frames", str(frames), *extra]
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


def compute_only(models: Sequence[Path], batches: Sequence[int], out: Path) -> dict[str, dict[int, float]]:
    """frames/s per (model name, batch) from scripts/bench_batch_gpu.py, run here in a subprocess."""
    script = Path(__file__).with_name("bench_batch_gpu.py")
    cmd = [sys.executable, str(script), "--models", *map(str, models), "--batches", ",".join(map(str, batches)),
           "--iterations", "200", "--rounds", "3", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_batch_gpu: exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
    data = json.loads(out.read_text())
    found: dict[str, dict[int, float]] = {}
    for name, entry in (data.get("models") or {}).items():
        found[Path(name).name] = {int(r["batch"]): float(r["frames_per_s"]) for r in entry.get("plain", [])
                                  if "frames_per_s" in r}
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="many_streams.json")
    ap.add_argument("--streams", default="1,4,8,16,32")
    ap.add_argument("--frames", type=int, default=300, help="frames per stream")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--backend", default="onnxruntime-cuda", help="onnxruntime for a quick check on a CPU machine")
    ap.add_argument("--tracking", default="off,on", help="off, on or off,on: rows without / with --track")
    ap.add_argument("--check-frames", type=int, default=60)
    ap.add_argument("--run-args", default="", help="more `edgert run` arguments for every row, e.g. "
                    "\"--capture thread\" or \"--memory zero-copy --slots 4\"")
    ap.add_argument("--batch-per-stream", type=int, default=0,
                    help="--batch = this x streams (default: edgert's own, one frame per stream)")
    ap.add_argument("--compute", action="store_true", help="also run scripts/bench_batch_gpu.py at these batches")
    ap.add_argument("--no-check", action="store_true", help="skip the batched-vs-alone check")
    args = ap.parse_args()
    extra = shlex.split(args.run_args)
    assets = assets_dir()
    video = assets / "video" / "vtest.avi"
    counts = [int(x) for x in args.streams.split(",")]
    tracking = [t.strip() == "on" for t in args.tracking.split(",")]
    models = [assets / "models" / "detection" / name for name in args.models]
    results: dict[str, Any] = {"machine": machine_info(), "frames_per_stream": args.frames, "run_args": extra,
                               "batch_per_stream": args.batch_per_stream or None, "cpu_count": os.cpu_count()}
    compute: dict[str, dict[int, float]] = {}
    if args.compute:
        try:
            batches = sorted({n * (args.batch_per_stream or 1) for n in counts})
            compute = compute_only(models, batches, Path(args.out).with_suffix(".compute.json"))
        except Exception as exc:  # the streams rows are still worth having
            results["compute_error"] = str(exc)
        results["compute_only_fps"] = {k: {str(b): v for b, v in d.items()} for k, d in compute.items()}
        print(f"compute-only: {json.dumps(results['compute_only_fps'])}", flush=True)
    for model in models:
        key = model.name.split("-")[0]
        rows: list[dict[str, Any]] = []
        results[key] = {"rows": rows}
        for track in tracking:
            for n in counts:
                try:
                    rows.append(run(model, video, n, args.frames, args.backend, extra, args.batch_per_stream, track))
                except Exception as exc:  # one failing row must not lose the others
                    rows.append({"streams": n, "tracking": track, "error": str(exc)})
                row = rows[-1]
                one = next((r for r in rows if r.get("streams") == 1 and r.get("tracking") == track
                            and "aggregate_fps" in r), None)
                if one and "aggregate_fps" in row:
                    row["over_one_stream"] = round(row["aggregate_fps"] / one["aggregate_fps"], 2)
                ref = compute.get(model.name, {}).get(int(row.get("batch") or 0))
                if ref and "aggregate_fps" in row:
                    row["compute_only_fps"] = ref
                    row["over_compute_only"] = round(row["aggregate_fps"] / ref, 2)
                print(f"{key}: {json.dumps(row)}", flush=True)
                write_json(args.out, results)
        if not args.no_check:
            try:
                results[key]["check"] = check(model, video, args.check_frames, args.backend, extra)
            except Exception as exc:
                results[key]["check"] = {"error": str(exc)}
            print(f"{key} check: {results[key]['check']}", flush=True)
        write_json(args.out, results)
    print("| model | streams | track | batch | aggregate fps | x one | / compute-only | spread | p50 ms | p99 ms | W "
          "| mJ/frame | host cores | core/stream |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        key = model.name.split("-")[0]
        for r in results.get(key, {}).get("rows", []):
            if "aggregate_fps" in r:
                w = r["watts"] if r["watts"] is None else round(r["watts"], 1)
                mj = r["mj_per_frame"] if r["mj_per_frame"] is None else round(r["mj_per_frame"], 1)
                print(f"| {key} | {r['streams']} | {'on' if r['tracking'] else 'off'} | {r['batch']} | "
                      f"{r['aggregate_fps']} | {r.get('over_one_stream')} | {r.get('over_compute_only')} | "
                      f"{r['per_stream_spread']} | {r['latency_p50_ms']} | {r['latency_p99_ms']} | {w} | {mj} | "
                      f"{r['host_cpu_cores']} | {r['host_cpu_per_stream']} |")
            else:
                print(f"| {key} | {r.get('streams')} | {'on' if r.get('tracking') else 'off'} | error: "
                      f"{str(r.get('error'))[-200:]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
