#!/usr/bin/env python3
"""Compute-only throughput per batch size (issue 13): the detectors with their batch made dynamic.

For each model, in one process:

1. the batch is made dynamic (:func:`edgert.rewrite.batch.batched_model_path`: rewritten, checked on
   ONNX Runtime CPU at batch 1 and 2, cached by sha256 under ``$EDGERT_CACHE_DIR/batch``). A model that
   cannot be rewritten is reported with the one-line reason and skipped.
2. for each batch size B, one session with ``shapes={input: (B, 3, H, W)}``; the input holds B different
   random images. ``--provider cuda`` (default): the onnxruntime-cuda backend's device-resident
   IOBinding buffers, timed with ``compute_only()`` (no host copies, one stream sync per call), as
   scripts/bench_one_pipeline.py takes its compute-only figures; ``--provider cpu``: the onnxruntime
   backend's ``infer()`` on its preallocated buffers (a quick local check). ``--rounds`` rounds of
   ``--iterations`` calls: calls/s is the median round, frames/s = B x calls/s, latency p50/p99 per
   call from the individually timed calls, and (CUDA, NVML) mJ per frame from the total-energy counter.
3. a check on the same provider: row i of the rewritten model at the largest B against the original
   batch-1 model on input i (max relative error over each output's largest value).

Usage (GPU machine, repo root, after the GPU stack and the assets are in place):
    python3 scripts/bench_batch_gpu.py --out batch_gpu.json
Quick local check:
    python3 scripts/bench_batch_gpu.py --provider cpu --batches 1,2 --iterations 5 --rounds 1 --out /tmp/b.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from _bench import Energy, assets_dir, machine_info

from edgert.errors import first_line

MODELS = ("yolov8s-fall-640.onnx", "nanodet-m-416-coco-v8layout.onnx", "yolov3-tiny-coco-416.onnx")



def batch_input(path: Path) -> tuple[str, tuple[int, ...]]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {t.name for t in graph.initializer}
    vi = next(i for i in graph.input if i.name not in inits)
    rest = tuple(int(d.dim_value) for d in list(vi.type.tensor_type.shape.dim)[1:])
    return vi.name, rest


def measure(model: Path, backend: str, name: str, rest: tuple[int, ...], b: int, iterations: int, rounds: int,
            energy: Energy, cuda_graph: bool) -> dict[str, Any]:
    from edgert.backends import SessionOptions, open_session

    opts = SessionOptions(shapes={name: (b, *rest)}, cuda_graph=cuda_graph)
    with open_session(model, backend, opts) as sess:
        sess.inputs[name][...] = np.random.default_rng(b).random(sess.inputs[name].shape, dtype=np.float32)
        sess.infer()  # the batch is on the device from here on (GPU); outputs sized
        call = getattr(sess, "compute_only", None) or sess.infer
        for _ in range(max(10, iterations // 10)):
            call()
        lat: list[float] = []
        round_s: list[float] = []
        e0 = energy.read()
        for _ in range(rounds):
            t_round = time.perf_counter()
            for _ in range(iterations):
                t0 = time.perf_counter()
                call()
                lat.append((time.perf_counter() - t0) * 1e3)
            round_s.append(time.perf_counter() - t_round)
        e1 = energy.read()
    calls = float(np.median([iterations / s for s in round_s]))
    frames = b * iterations * rounds
    return {
        "batch": b,
        "calls_per_s": round(calls, 1),
        "frames_per_s": round(b * calls, 1),
        "frames_per_s_rounds": [round(b * iterations / s, 1) for s in round_s],
        "latency_ms_p50": round(float(np.percentile(lat, 50)), 3),
        "latency_ms_p99": round(float(np.percentile(lat, 99)), 3),
        "energy_mj_per_frame": None if e0 is None or e1 is None else round((e1 - e0) / frames, 3),
        "mean_power_w": None if e0 is None or e1 is None else round((e1 - e0) / 1000 / sum(round_s), 1),
        "iterations": iterations,
        "rounds": rounds,
        "timed": "compute_only (device-resident IOBinding)" if hasattr(sess, "compute_only") else "infer",
    }


def check_rows(original: Path, batched: Path, backend: str, name: str, rest: tuple[int, ...], b: int) -> dict[str, Any]:
    """Row i of the batched model at batch b against the original model on input i, on this provider."""
    from edgert.backends import SessionOptions, open_session

    x = np.random.default_rng(99).random((b, *rest), dtype=np.float32)
    worst = 0.0
    with open_session(batched, backend, SessionOptions(shapes={name: (b, *rest)})) as sb:
        got = {k: v.copy() for k, v in sb.infer({name: x}).items()}
    with open_session(original, backend, SessionOptions()) as so:
        for r in range(b):
            want = so.infer({name: x[r:r + 1]})
            for k, w in want.items():
                scale = float(np.abs(w).max()) or 1.0
                worst = max(worst, float(np.abs(got[k][r:r + 1].astype(np.float64) - w).max()) / scale)
    return {"batch": b, "max_rel_err": worst, "rows_match_1e-4": worst <= 1e-4}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(MODELS), help="paths, or names under assets/models/detection")
    ap.add_argument("--batches", default="1,2,4,8", help="batch sizes (default 1,2,4,8)")
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--iterations", type=int, default=400, help="calls per round (default 400)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cuda-graph", action="store_true", help="also measure with ORT's CUDA graph replay")
    ap.add_argument("--out", default="batch_gpu.json")
    args = ap.parse_args()
    from edgert.errors import EdgertError
    from edgert.rewrite.batch import batched_model_path

    batches = [int(x) for x in args.batches.split(",") if x.strip()]
    backend = "onnxruntime-cuda" if args.provider == "cuda" else "onnxruntime"
    energy = Energy(args.provider == "cuda")
    import onnxruntime as ort

    report: dict[str, Any] = {"provider": args.provider, "backend": backend, "onnxruntime": ort.__version__,
                              "batches": batches, "models": {}}
    if args.provider == "cuda":
        try:
            from edgert.backends.cuda import device_identity

            report["device"] = dict(zip(("name", "compute_capability", "driver"), device_identity(0)))
        except Exception as exc:
            report["device"] = {"error": str(exc)}
    else:
        report["device"] = {"cpu_count": os.cpu_count()}
    report["machine"] = machine_info()
    out = Path(args.out)

    def save() -> None:
        out.write_text(json.dumps(report, indent=1, default=str))

    variants = [False, True] if args.cuda_graph and args.provider == "cuda" else [False]
    for mname in args.models:
        src = Path(mname) if Path(mname).exists() else assets_dir() / "models" / "detection" / mname
        r: dict[str, Any] = {}
        report["models"][src.name] = r
        if not src.exists():
            r["error"] = f"{src}: not found"
            print(f"== {src.name}: not found, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            batched = batched_model_path(src)
        except EdgertError as exc:
            r["error"] = str(exc)
            print(f"== {src.name}: batch cannot be made dynamic: {exc}", flush=True)
            save()
            continue
        r["batched_model"] = str(batched)
        r["rewrite_and_cpu_check_s"] = round(time.perf_counter() - t0, 2)
        name, rest = batch_input(batched)
        r["input"] = [name, list(rest)]
        for graph in variants:
            key = "cuda_graph" if graph else "plain"
            rows: list[dict[str, Any]] = []
            r[key] = rows
            for b in batches:
                print(f"== {src.name} {key} batch {b}", flush=True)
                try:
                    res = measure(batched, backend, name, rest, b, args.iterations, args.rounds, energy, graph)
                except Exception as exc:
                    first = first_line(exc, "")
                    rows.append({"batch": b, "error": f"{type(exc).__name__}: {first}",
                                 "traceback": traceback.format_exc()[-1500:]})
                    print(f"   failed: {rows[-1]['error']}", flush=True)
                    save()
                    continue
                base = next((x for x in rows if x.get("batch") == 1 and "frames_per_s" in x), None)
                if base:
                    res["x_batch1"] = round(res["frames_per_s"] / base["frames_per_s"], 2)
                rows.append(res)
                print(f"   {res['frames_per_s']} frames/s, p50 {res['latency_ms_p50']} ms, "
                      f"p99 {res['latency_ms_p99']} ms", flush=True)
                save()
        try:
            r["check"] = check_rows(src, batched, backend, name, rest, max(batches))
        except Exception as exc:
            r["check"] = {"error": f"{type(exc).__name__}: {first_line(exc, '')}"}
        save()

    print("\n| model | variant | batch | calls/s | frames/s | x batch 1 | p50 ms | p99 ms | mJ/frame |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mname, r in report["models"].items():
        if "error" in r:
            print(f"| {mname} | - | - | {r['error']} | | | | | |")
            continue
        for key in ("plain", "cuda_graph"):
            for x in r.get(key, []):
                if "error" in x:
                    print(f"| {mname} | {key} | {x['batch']} | {x['error']} | | | | | |")
                    continue
                print(f"| {mname} | {key} | {x['batch']} | {x['calls_per_s']} | {x['frames_per_s']} | "
                      f"{x.get('x_batch1', 1.0)} | {x['latency_ms_p50']} | {x['latency_ms_p99']} | "
                      f"{x['energy_mj_per_frame'] if x['energy_mj_per_frame'] is not None else ''} |")
        chk = r.get("check", {})
        print(f"| {mname} | check | {chk.get('batch', '')} | rows vs batch-1 original: max rel err "
              f"{chk.get('max_rel_err', chk.get('error'))} | | | | | |")
    print(f"provider {args.provider} ({backend}), onnxruntime {ort.__version__}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
