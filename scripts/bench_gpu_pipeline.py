#!/usr/bin/env python3
"""GPU pipeline benchmark and checks (issue 9), one run on a CUDA machine; writes JSON and prints a table.

For each model, in ONE process:

1. compute-only: the model alone on device-resident input and output (IOBinding, no copies), 400
   iterations per round, 3 rounds (FPS = median round; energy = NVML total-energy counter over all
   rounds / iterations). Also with the model's launches replayed as a CUDA graph (ORT
   ``enable_cuda_graph``) where ONNX Runtime accepts it, and with K sessions on K threads.
2. the end-to-end GPU pipeline (edgert.pipeline.gpu) over ``vtest.avi``: frames are decoded with
   OpenCV *before* timing and held in a list in memory, so the device's CPU video decoding is not what
   is measured; the timed loop hands those BGR frames to the pipeline (host copy into the slot's
   page-locked staging buffer, upload, letterbox kernel, model, GPU confidence filter, readback, NMS)
   and collects every frame's Detections in order. Pinned and zero-copy memory, 2 and 3 slots, with
   and without the CUDA graph.
3. the "typical Python loop" for reference: CPU letterbox (edgert Preprocessor), copies through
   pinned buffers, the model, numpy decode + NMS (edgert Detector on the onnxruntime-cuda backend).
4. checks: GPU tensors against the CPU Preprocessor (max abs error), GPU detections against the CPU
   path's (same count, same classes, boxes within 1 px) on the asset images and vtest frames, and
   zero-copy detections against pinned ones.

Usage (on the device: scripts/gpu_pipeline.sh):
    python3 scripts/bench_gpu_pipeline.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgert._lazy import lazy_import  # noqa: E402
from edgert.vision.detections import Detections  # noqa: E402

log = logging.getLogger("bench_gpu_pipeline")

MODELS = ("nanodet-m-416-coco-v8layout.onnx", "yolov8s-fall-640.onnx")


# -- helpers -----------------------------------------------------------------------------------------
def assets_dir() -> Path:
    return Path(os.environ.get("EDGERT_ASSETS", ROOT.parent / "shared" / "assets"))


def load_frames(video: Path, limit: int | None) -> list[np.ndarray]:
    cv2 = lazy_import("cv2", "video decoding")
    cap = cv2.VideoCapture(str(video))
    frames: list[np.ndarray] = []
    while limit is None or len(frames) < limit:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(np.ascontiguousarray(frame))
    cap.release()
    if not frames:
        raise SystemExit(f"no frames decoded from {video}")
    return frames


class Energy:
    """NVML total-energy counter (mJ since driver load) of GPU 0; None where NVML is missing."""

    def __init__(self) -> None:
        self.nv: Any = None
        try:
            nv = lazy_import("pynvml", "NVML energy")
            nv.nvmlInit()
            self.handle = nv.nvmlDeviceGetHandleByIndex(0)
            nv.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.nv = nv
        except Exception as exc:
            log.warning("no NVML energy counter: %s", exc)

    def read(self) -> float | None:
        if self.nv is None:
            return None
        return float(self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def power_w(self) -> float | None:
        if self.nv is None:
            return None
        return float(self.nv.nvmlDeviceGetPowerUsage(self.handle)) / 1000.0


def per_frame_mj(e0: float | None, e1: float | None, frames: int) -> float | None:
    if e0 is None or e1 is None or frames <= 0:
        return None
    return round((e1 - e0) / frames, 2)


def match_detections(a: Detections, b: Detections) -> dict[str, Any]:
    """Pair ``a``'s boxes with ``b``'s of the same class (closest first); max box difference in px."""
    used = np.zeros(len(b), bool)
    worst = 0.0
    unmatched = 0
    for i in np.argsort(-a.confidence, kind="stable"):
        cands = np.flatnonzero((b.class_id == a.class_id[i]) & ~used)
        if not cands.size:
            unmatched += 1
            continue
        diff = np.abs(b.xyxy[cands] - a.xyxy[i]).max(axis=1)
        j = int(cands[int(diff.argmin())])
        used[j] = True
        worst = max(worst, float(diff.min()))
    return {"count_a": len(a), "count_b": len(b), "unmatched": unmatched + int((~used).sum()), "max_box_diff_px": worst}


def summarize_matches(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "frames": len(pairs),
        "frames_same_count": sum(p["count_a"] == p["count_b"] for p in pairs),
        "detections": sum(p["count_a"] for p in pairs),
        "unmatched": sum(p["unmatched"] for p in pairs),
        "max_box_diff_px": round(max((p["max_box_diff_px"] for p in pairs), default=0.0), 4),
        "all_within_1px_same_classes": all(p["unmatched"] == 0 and p["max_box_diff_px"] <= 1.0 for p in pairs),
    }


# -- measurements ------------------------------------------------------------------------------------
def compute_only(
    model: Path, frame: np.ndarray, energy: Energy, iterations: int, rounds: int, cuda_graph: bool = False
) -> dict[str, Any]:
    """The model alone on device-resident buffers, as issue 9's reference numbers were taken."""
    from edgert.backends import SessionOptions, open_session
    from edgert.config import PreprocessConfig
    from edgert.vision.detector import image_input
    from edgert.vision.preprocess import Preprocessor

    with open_session(model, "onnxruntime-cuda", SessionOptions(cuda_graph=cuda_graph)) as sess:
        spec = image_input(sess)
        pre = Preprocessor(PreprocessConfig(), spec, sess.metadata)
        pre(frame, sess.inputs[spec.name])
        sess.infer()  # puts a real frame on the device (input) once
        for _ in range(30):
            sess.compute_only()  # type: ignore[attr-defined]
        times = []
        e0 = energy.read()
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(iterations):
                sess.compute_only()  # type: ignore[attr-defined]
            times.append(time.perf_counter() - t0)
        e1 = energy.read()
    fps = [iterations / t for t in times]
    return {
        "fps": round(float(np.median(fps)), 1),
        "fps_rounds": [round(f, 1) for f in fps],
        "iterations": iterations,
        "rounds": rounds,
        "energy_mj_per_frame": per_frame_mj(e0, e1, iterations * rounds),
        "mean_power_w": None if e0 is None or e1 is None else round((e1 - e0) / 1000 / sum(times), 1),
        "cuda_graph": cuda_graph,
    }


def compute_only_threads(model: Path, frame: np.ndarray, energy: Energy, k: int, iterations: int) -> dict[str, Any]:
    """K sessions on K threads, each running the model alone: the ceiling that overlap can reach."""
    from edgert.backends import SessionOptions, open_session
    from edgert.config import PreprocessConfig
    from edgert.vision.detector import image_input
    from edgert.vision.preprocess import Preprocessor

    sessions = [open_session(model, "onnxruntime-cuda", SessionOptions()) for _ in range(k)]
    try:
        for sess in sessions:
            spec = image_input(sess)
            Preprocessor(PreprocessConfig(), spec, sess.metadata)(frame, sess.inputs[spec.name])
            sess.infer()
            for _ in range(20):
                sess.compute_only()  # type: ignore[attr-defined]
        barrier = threading.Barrier(k + 1)

        def loop(sess: Any) -> None:
            with sess.device.active():
                barrier.wait()
                for _ in range(iterations):
                    sess.compute_only()

        threads = [threading.Thread(target=loop, args=(s,)) for s in sessions]
        for t in threads:
            t.start()
        e0 = energy.read()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        e1 = energy.read()
    finally:
        for s in sessions:
            s.close()
    return {
        "sessions": k,
        "fps": round(k * iterations / dt, 1),
        "energy_mj_per_frame": per_frame_mj(e0, e1, k * iterations),
    }


def pipeline_run(
    model: Path,
    frames: list[np.ndarray],
    energy: Energy,
    memory: str,
    slots: int,
    passes: int,
    cuda_graph: bool = False,
) -> tuple[dict[str, Any], list[Detections]]:
    from edgert.pipeline.gpu import GpuPipeline, GpuPipelineOptions

    opts = GpuPipelineOptions(memory=memory, slots=slots, cuda_graph=cuda_graph)  # type: ignore[arg-type]
    with GpuPipeline(model, options=opts) as pipe:
        for _ in pipe.run(frames[: max(40, 10 * slots)]):  # warm-up: kernels, cuDNN algorithms, graphs
            pass
        pipe.reset_times()
        stream_of_frames = (f for _ in range(passes) for f in frames)
        dets: list[Detections] = []
        e0 = energy.read()
        t0 = time.perf_counter()
        for _i, det in pipe.run(stream_of_frames):
            dets.append(det)
        dt = time.perf_counter() - t0
        e1 = energy.read()
        n = len(dets)
        info = pipe.describe()
        info.update(
            {
                "frames": n,
                "passes": passes,
                "fps": round(n / dt, 1),
                "seconds": round(dt, 3),
                "energy_mj_per_frame": per_frame_mj(e0, e1, n),
                "mean_power_w": None if e0 is None or e1 is None else round((e1 - e0) / 1000 / dt, 1),
                "stages": pipe.stage_times(),
                "detections": sum(len(d) for d in dets),
                "cuda_graph": cuda_graph,
                "overflow_frames": sum(s.filter.overflows for s in pipe.slots if s.filter is not None),
            }
        )
    return info, dets[: len(frames)]


def cpu_loop(model: Path, frames: list[np.ndarray], energy: Energy) -> tuple[dict[str, Any], list[Detections]]:
    """The usual Python loop: CPU letterbox, copies, the model, numpy decode + NMS, one frame at a time."""
    from edgert.vision.detector import Detector

    with Detector(model, backend="onnxruntime-cuda") as det:
        for f in frames[:20]:
            det(f)
        out: list[Detections] = []
        e0 = energy.read()
        t0 = time.perf_counter()
        for f in frames:
            out.append(det(f))
        dt = time.perf_counter() - t0
        e1 = energy.read()
    return {
        "frames": len(frames),
        "fps": round(len(frames) / dt, 1),
        "energy_mj_per_frame": per_frame_mj(e0, e1, len(frames)),
    }, out


def check_equivalence(model: Path, images: list[tuple[str, np.ndarray]]) -> dict[str, Any]:
    """GPU tensors vs the CPU Preprocessor and vs the kernel's numpy emulation; detections vs the CPU path."""
    from edgert.pipeline.gpu import GpuPipeline, GpuPipelineOptions
    from edgert.vision.detector import Detector
    from edgert.vision.gpu_preprocess import emulate_letterbox

    tensor_err = 0.0
    emu_err = 0.0
    differing = 0
    pairs = []
    per_image = []
    with GpuPipeline(model, options=GpuPipelineOptions(memory="pinned", slots=1)) as pipe, \
            Detector(model, backend="onnxruntime-cuda") as cpu:
        for name, img in images:
            cpu_t = cpu.preprocessor.allocate()
            t_cpu = cpu.preprocessor(img, cpu_t)
            gpu_t, t_gpu = pipe.preprocess_to_host(img)
            err = float(np.abs(gpu_t.astype(np.float64) - cpu_t.astype(np.float64)).max())
            emu = emulate_letterbox(img, pipe.plan).astype(np.float64)
            e_emu = float(np.abs(gpu_t[0].astype(np.float64) - emu).max())
            tensor_err = max(tensor_err, err)
            emu_err = max(emu_err, e_emu)
            differing += int((gpu_t != cpu_t).sum())
            if t_cpu != t_gpu:
                raise SystemExit(f"{name}: letterbox transforms differ: {t_cpu} vs {t_gpu}")
            a = cpu(img)
            b = pipe.detect(img)
            m = match_detections(a, b)
            pairs.append(m)
            per_image.append(
                {
                    "image": name,
                    "shape": list(img.shape),
                    "tensor_max_abs_err": err,
                    "cpu": a.to_records(),
                    "gpu": b.to_records(),
                    **m,
                }
            )
    return {
        "images": len(images),
        "tensor_max_abs_err": tensor_err,
        "tensor_elements_differing": differing,
        "kernel_vs_numpy_emulation_max_abs_err": emu_err,
        "detections": summarize_matches(pairs),
        "per_image": per_image,
    }


def model_steps(
    model: Path,
    frames: list[np.ndarray],
    images: list[tuple[str, np.ndarray]],
    energy: Energy,
    args: argparse.Namespace,
) -> list[tuple[str, Any]]:
    """The measurements of one model, in order (one list per model, so each closure binds its model)."""
    it, rounds, passes = args.iterations, args.rounds, args.passes
    steps: list[tuple[str, Any]] = [
        ("compute_only", lambda: compute_only(model, frames[0], energy, it, rounds)),
        ("check", lambda: check_equivalence(model, images)),
    ]
    for slots in args.slots if not args.quick else [2]:
        steps.append(
            (f"pipeline_pinned_{slots}slots", lambda s=slots: pipeline_run(model, frames, energy, "pinned", s, passes))
        )
    steps.append(("pipeline_zero-copy_2slots", lambda: pipeline_run(model, frames, energy, "zero-copy", 2, 1)))
    if not args.quick:
        steps.append(
            ("compute_only_cuda_graph", lambda: compute_only(model, frames[0], energy, it, rounds, cuda_graph=True))
        )
        steps.append(
            (
                "pipeline_pinned_2slots_cuda_graph",
                lambda: pipeline_run(model, frames, energy, "pinned", 2, passes, cuda_graph=True),
            )
        )
        steps.append(("compute_only_2sessions_2threads", lambda: compute_only_threads(model, frames[0], energy, 2, it)))
        steps.append(
            (
                "pipeline_pinned_3slots_cuda_graph",
                lambda: pipeline_run(model, frames, energy, "pinned", 3, passes, cuda_graph=True),
            )
        )
        steps.append(("typical_python_loop", lambda: cpu_loop(model, frames[:400], energy)))
        video = Path(args.video) if args.video else assets_dir() / "video" / "vtest.avi"
        steps.append(("edgert_run_gpu_pipeline_preload", lambda: cli_run(model, video, ["--preload"])))
        steps.append(("edgert_run_gpu_pipeline_live_decode", lambda: cli_run(model, video, [])))
    if args.steps:
        steps = [(k, fn) for k, fn in steps if any(k.startswith(p) for p in args.steps)]
    return steps


def cli_run(model: Path, video: Path, extra: list[str]) -> dict[str, Any]:
    """``edgert run --gpu-pipeline --json`` in a subprocess (the real CLI, power from its own sampler)."""
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "edgert.cli.main",
        "run",
        "--gpu-pipeline",
        "--json",
        "--model",
        str(model),
        "--source",
        str(video),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"edgert run failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    summary: dict[str, Any] = json.loads(proc.stdout)
    return {
        "command": " ".join(["edgert", *cmd[3:]]),
        "fps": summary.get("fps"),
        "frames": summary.get("frames"),
        "energy_mj_per_frame": summary.get("mj_per_frame"),
        "watts": summary.get("watts"),
        "gpu_stages_ms": summary.get("gpu_stages_ms"),
        "memory": summary.get("memory"),
        "slots": summary.get("slots"),
        "detections": summary.get("detections"),
    }


# -- main --------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--video", default=None, help="default: $EDGERT_ASSETS/video/vtest.avi")
    ap.add_argument("--frames", type=int, default=None, help="frames of the video to hold in memory (default all)")
    ap.add_argument("--passes", type=int, default=2, help="passes over the frames for the pipeline timing")
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, nargs="*", default=[2, 3])
    ap.add_argument("--quick", action="store_true", help="fewer variants (pinned 2 slots, zero-copy 2 slots)")
    ap.add_argument("--out", default="gpu_pipeline.json")
    ap.add_argument("--steps", nargs="*", default=None, help="only the measurements whose names start with these")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cv2 = lazy_import("cv2", "images")

    assets = assets_dir()
    video = Path(args.video) if args.video else assets / "video" / "vtest.avi"
    t0 = time.perf_counter()
    frames = load_frames(video, args.frames)
    decode_s = time.perf_counter() - t0
    paths = [p for p in sorted((assets / "images").glob("*")) if p.suffix in (".jpg", ".png")]
    images = [(p.name, cv2.imread(str(p))) for p in paths]
    images = [(n, im) for n, im in images if im is not None]
    images += [(f"vtest#{i}", frames[i]) for i in range(0, len(frames), max(1, len(frames) // 12))]
    energy = Energy()
    from edgert.backends.cuda import CudaDevice, device_identity, device_traits

    name, cc, driver = device_identity(0)
    dev = CudaDevice.get(0)
    with dev.active():
        traits = device_traits(dev)
    ort = lazy_import("onnxruntime")
    report: dict[str, Any] = {
        "device": {
            "name": name,
            "compute_capability": cc,
            "driver": driver,
            **traits,
            "onnxruntime": ort.__version__,
            "opencv": cv2.__version__,
            "idle_power_w": energy.power_w(),
        },
        "video": {
            "path": video.name,
            "frames": len(frames),
            "shape": list(frames[0].shape),
            "decode_seconds_before_timing": round(decode_s, 2),
            "how": "all frames decoded with cv2.VideoCapture into a list before any timing",
        },
        "models": {},
    }
    out_path = Path(args.out)

    def save() -> None:
        out_path.write_text(json.dumps(report, indent=1, default=str))

    for mname in args.models:
        model = Path(mname) if Path(mname).exists() else assets / "models" / "detection" / mname
        r: dict[str, Any] = {}
        report["models"][model.name] = r
        steps = model_steps(model, frames, images, energy, args)
        dets: dict[str, list[Detections]] = {}
        for key, fn in steps:
            print(f"== {model.name}: {key}", flush=True)
            try:
                res = fn()
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                r[key] = {"error": f"{type(exc).__name__}: {first}", "traceback": traceback.format_exc()[-2000:]}
                print(f"   failed: {r[key]['error']}", flush=True)
                save()
                continue
            if isinstance(res, tuple):
                res, d = res
                dets[key] = d
            r[key] = res
            brief = {k: v for k, v in res.items() if k in ("fps", "energy_mj_per_frame", "tensor_max_abs_err")}
            print(f"   {brief}", flush=True)
            save()
        # zero-copy and pinned must give the same detections; the pipeline the same as the typical loop
        base = dets.get("pipeline_pinned_2slots")
        for other in ("pipeline_zero-copy_2slots", "pipeline_pinned_2slots_cuda_graph", "typical_python_loop"):
            if base is not None and other in dets:
                n = min(len(base), len(dets[other]))
                r[f"match_{other}_vs_pinned"] = summarize_matches(
                    [match_detections(dets[other][i], base[i]) for i in range(n)]
                )
        co = r.get("compute_only", {})
        for key, res in list(r.items()):
            if key.startswith("pipeline") and isinstance(res, dict) and "fps" in res and co.get("fps"):
                res["fps_vs_compute_only"] = round(res["fps"] / co["fps"], 3)
                if res.get("energy_mj_per_frame") and co.get("energy_mj_per_frame"):
                    res["energy_vs_compute_only"] = round(res["energy_mj_per_frame"] / co["energy_mj_per_frame"], 3)
        save()

    # -- table ---------------------------------------------------------------------------------------
    print("\n| model | run | FPS | x compute-only | mJ/frame | x compute-only energy |")
    print("|---|---|---|---|---|---|")
    for mname, r in report["models"].items():
        for key, res in r.items():
            if isinstance(res, dict) and "fps" in res:
                print(
                    f"| {mname} | {key} | {res['fps']} | {res.get('fps_vs_compute_only', '')} | "
                    f"{res.get('energy_mj_per_frame', '')} | {res.get('energy_vs_compute_only', '')} |"
                )
        chk = r.get("check", {})
        if "detections" in chk:
            print(
                f"| {mname} | check | tensor max abs err {chk['tensor_max_abs_err']} | emulation err "
                f"{chk['kernel_vs_numpy_emulation_max_abs_err']} | {chk['detections']} | |"
            )
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
