#!/usr/bin/env python3
"""The one pipeline on a GPU machine: is the product path as fast as the engine, and does it keep its promises?

In ONE process on a CUDA machine (the H200 device: ``scripts/gpu_pipeline.sh``), writing JSON and printing
a table:

1. **compute-only**, per model: one ONNX Runtime CUDA session on device-resident input and output (IOBinding,
   no copies), 400 iterations x 3 rounds (FPS = median round), energy per frame from NVML through edgert's
   power sampler;
2. **edgert run** as a user types it, per model: ``edgert run --backend onnxruntime-cuda --model M --source
   vtest.avi --json`` (no processing flag: auto must pick the GPU processor), the video decoded live by
   OpenCV on the CPU while the GPU works; once as typed (795 frames) and once with ``--loop --max-frames``
   for a steadier figure. Ratio = pipeline FPS / compute-only FPS; energy per frame side by side;
3. **power budget**: idle watts, the unconstrained draw (yolov8s, from step 2), then ``edgert run --power-budget
   B`` at two budgets between them, NVML average measured here (independently of the run) over a window after
   the controller has settled;
4. **memory**: a GPU-processor pipeline (nanodet, vtest looped, a JSONL sink) for 40 000 frames; peak RSS
   (``ru_maxrss``) after 2 000 and after 40 000 frames.

    python3 scripts/bench_one_pipeline.py --out one_pipeline.json [--steps compute run budget rss]
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from _bench import RssProbe, assets_dir, machine_info

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.pipeline import Pipeline
from edgert.pipeline.hooks import open_power_sampler

MODELS = ("nanodet-m-416-coco-v8layout.onnx", "yolov8s-fall-640.onnx")



def compute_only(model: Path, iterations: int = 400, rounds: int = 3) -> dict[str, Any]:
    """One session, the model alone on device buffers holding a real letterboxed frame."""
    import cv2

    from edgert.backends import SessionOptions, open_session
    from edgert.config import PreprocessConfig
    from edgert.vision.opened import image_input
    from edgert.vision.preprocess import Preprocessor

    cap = cv2.VideoCapture(str(assets_dir() / "video" / "vtest.avi"))
    ok, frame = cap.read()
    cap.release()
    assert ok
    with open_session(model, "onnxruntime-cuda", SessionOptions()) as sess:
        spec = image_input(sess)
        Preprocessor(PreprocessConfig(), spec, sess.metadata)(frame, sess.inputs[spec.name])
        sess.infer()  # the frame goes to the device once
        for _ in range(30):
            sess.compute_only()  # type: ignore[attr-defined]
        sampler = open_power_sampler(PipelineConfig())
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(iterations):
                sess.compute_only()  # type: ignore[attr-defined]
                if sampler is not None:
                    sampler.frame_done()
            times.append(time.perf_counter() - t0)
        power = None
        if sampler is not None:
            sampler.stop()
            power = sampler.summary()
    fps = [iterations / t for t in times]
    return {"fps": round(float(np.median(fps)), 1), "fps_rounds": [round(f, 1) for f in fps],
            "iterations": iterations, "rounds": rounds,
            "watts": power and power.get("avg_w"), "mj_per_frame": power and power.get("mj_per_frame")}


def edgert_run(*args: str, timeout: float = 600, stop_after: float | None = None) -> dict[str, Any]:
    """``edgert run ... --json`` in a subprocess (SIGTERM after ``stop_after`` seconds when given)."""
    cmd = [sys.executable, "-m", "edgert.cli.main", "run", *args, "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if stop_after is not None:
        time.sleep(stop_after)
        proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"edgert run exited {proc.returncode}: {stderr.strip()[-600:]}")
    summary: dict[str, Any] = json.loads(stdout)
    summary["command"] = " ".join(["edgert", "run", *args, "--json"])
    return summary


def brief(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("command", "processing", "slots", "frames", "fps", "watts", "mj_per_frame", "stopped_by", "drops")
    out = {k: summary.get(k) for k in keys}
    out["latency_ms_total"] = (summary.get("latency_ms") or {}).get("total")
    out["gpu_ms"] = summary.get("gpu_ms")
    out["processor"] = summary.get("processor")
    return out


def watts_over(seconds: float) -> float | None:
    sampler = open_power_sampler(PipelineConfig())
    if sampler is None:
        return None
    time.sleep(seconds)
    sampler.stop()
    avg = sampler.summary().get("avg_w")
    return None if avg is None else float(avg)


def budget_run(model: Path, video: Path, budget: float, settle_s: float, judge_s: float) -> dict[str, Any]:
    """``edgert run --power-budget``; NVML average measured here over [settle_s, settle_s + judge_s]."""
    cmd = [sys.executable, "-m", "edgert.cli.main", "run", "--backend", "onnxruntime-cuda", "--model", str(model),
           "--source", str(video), "--loop", "--power-budget", f"{budget:.1f}W", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(settle_s)
        judged = watts_over(judge_s)
    finally:
        proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"edgert run exited {proc.returncode}: {stderr.strip()[-600:]}")
    summary = json.loads(stdout)
    return {"budget_w": round(budget, 1), "judged_avg_w": judged, "judge_window_s": [settle_s, settle_s + judge_s],
            "within_5pct_at_or_under": judged is not None and judged <= budget * 1.05,
            "run_fps": summary.get("fps"), "run_power": summary.get("power"), "stopped_by": summary.get("stopped_by")}


def rss_run(model: Path, video: Path, frames: int, processing: str) -> dict[str, Any]:
    probe = RssProbe((1000, 2000, 8000, 20000, frames))
    with tempfile.TemporaryDirectory() as tmp:
        config = PipelineConfig(
            model=ModelConfig(path=str(model), backend="onnxruntime-cuda" if processing == "gpu" else "auto"),
            source=SourceConfig(uri=str(video), loop=True), sinks=(f"jsonl://{tmp}/e.jsonl",),
            runtime=RuntimeConfig(max_frames=frames, processing=processing))  # type: ignore[arg-type]
        summary = Pipeline(config, observers=[probe], handle_signals=False).run()
    peaks = {str(k): v for k, v in sorted(probe.peak_kib.items())}
    first = probe.peak_kib.get(2000 if processing == "gpu" else 1000)
    last = probe.peak_kib.get(frames)
    return {"processing": processing, "frames": summary["frames"], "fps": summary["fps"], "peak_rss_kib": peaks,
            "growth_mib": None if first is None or last is None else round((last - first) / 1024, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="one_pipeline.json")
    ap.add_argument("--steps", nargs="*", default=["compute", "run", "budget", "rss"])
    ap.add_argument("--loop-frames", type=int, default=4000)
    ap.add_argument("--rss-frames", type=int, default=40000)
    args = ap.parse_args()
    assets = assets_dir()
    video = assets / "video" / "vtest.avi"
    results: dict[str, Any] = {"machine": {**machine_info(), "node": platform.node()},
                               "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    try:
        results["machine"]["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,power.draw", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass

    def step(name: str, fn: Any) -> Any:
        try:
            value = fn()
        except Exception as exc:  # one failing step must not lose the others' figures
            value = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        results[name] = value
        print(f"== {name}: {json.dumps(value)[:1500]}", flush=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        return value

    for name in MODELS:
        model = assets / "models" / "detection" / name
        key = name.split("-")[0]
        if "compute" in args.steps:
            step(f"{key}.compute_only", lambda model=model: compute_only(model))
        if "run" in args.steps:
            base = ["--backend", "onnxruntime-cuda", "--model", str(model), "--source", str(video)]
            step(f"{key}.edgert_run", lambda base=base: brief(edgert_run(*base)))
            step(f"{key}.edgert_run_loop",
                 lambda base=base: brief(edgert_run(*base, "--loop", "--max-frames", str(args.loop_frames))))
            co = results.get(f"{key}.compute_only", {})
            for variant in ("edgert_run", "edgert_run_loop"):
                run = results.get(f"{key}.{variant}", {})
                if co.get("fps") and run.get("fps"):
                    run["ratio_to_compute_only"] = round(run["fps"] / co["fps"], 3)
                    if co.get("mj_per_frame") and run.get("mj_per_frame"):
                        run["energy_ratio_to_compute_only"] = round(run["mj_per_frame"] / co["mj_per_frame"], 3)
    if "budget" in args.steps:
        model = assets / "models" / "detection" / MODELS[1]
        idle = step("power.idle_w", lambda: watts_over(5.0))
        full = (results.get("yolov8s.edgert_run_loop") or {}).get("watts")
        if not isinstance(full, (int, float)):
            full = step("power.unconstrained", lambda: brief(edgert_run(
                "--backend", "onnxruntime-cuda", "--model", str(model), "--source", str(video), "--loop",
                "--max-frames", "6000"))).get("watts")
        if isinstance(idle, (int, float)) and isinstance(full, (int, float)) and full > idle:
            for frac in (0.4, 0.7):
                budget = idle + frac * (full - idle)
                step(f"power.budget_{frac}", lambda budget=budget: budget_run(model, video, budget, 20.0, 12.0))
    if "rss" in args.steps:
        model = assets / "models" / "detection" / MODELS[0]
        step("memory.gpu_rss", lambda: rss_run(model, video, args.rss_frames, "gpu"))
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
