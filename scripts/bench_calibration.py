#!/usr/bin/env python3
"""Benchmark of INT8 calibration: accuracy per method, memory 32 vs 500 images, ONNX Runtime's quantize_static.

Every figure comes from one run of this script, each measured step in its own subprocess so its peak
RSS is its own (read with ``resource.getrusage(RUSAGE_CHILDREN)`` in a wrapper process):

1. accuracy: ``edgert calibrate`` each model with 32 images of ``--images`` and each method, then
   ``edgert compare`` on the images calibration did not use plus ``--frames`` frames of ``--video``:
   mAP@0.5:0.95 of INT8 detections against FP32 detections (conf 0.25). Optionally (``--max-drop``) the
   mixed-precision variant of the best method.
2. memory: ``edgert calibrate`` on 32 and on 500 images. The asset folder has 42 images, so the 500 are
   made by deterministic augmentation (image ``i`` = source ``i % 42`` with a horizontal flip for odd
   ``i // 42``, a random crop of 70-100 % of each side and a brightness/contrast change drawn from a
   generator seeded with ``i``), written as JPEG to a temporary folder.
3. ONNX Runtime: ``quantize_static`` (QDQ, symmetric INT8 activations and per-channel weights, float
   biases, the same tail and -inf padding excluded, fed the same preprocessed tensors) with its entropy
   and min-max calibrators, time and peak RSS. Its entropy calibrator keeps every activation of every
   image (~98 MiB per image on NanoDet), so it runs on ``--ort-images`` (default 32; 500 would need
   ~48 GiB on a 24 GiB machine).
4. TensorRT-RTX (when ``tensorrt_rtx`` imports): parse and build each Q/DQ model as a strongly typed
   network on the CPU.

    .venv/bin/python scripts/bench_calibration.py --out /tmp/bench_calib            # everything
    .venv/bin/python scripts/bench_calibration.py --only memory --models nanodet    # one part
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import ROOT, assets_dir, machine_info

ASSETS = assets_dir()
MODELS = {
    "nanodet": ASSETS / "models/detection/nanodet-m-416-coco-v8layout.onnx",
    "yolov8s": ASSETS / "models/detection/yolov8s-fall-640.onnx",
}
EDGERT = [sys.executable, "-m", "edgert.cli.main"]


# -- measuring a child ---------------------------------------------------------------------------------
def measured(cmd: list[str], timeout: float = 3600) -> dict[str, Any]:
    """Run ``cmd`` through a wrapper process that reports the child's wall time and peak RSS."""
    wrapper = [sys.executable, __file__, "--measure-child", "--", *cmd]
    proc = subprocess.run(wrapper, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    try:
        info: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"rc": proc.returncode, "error": proc.stderr[-2000:]}
    info["stdout"] = "\n".join(lines[:-1])
    info["stderr"] = proc.stderr[-4000:]
    return info


def _measure_child(cmd: list[str]) -> int:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    print(json.dumps({"rc": proc.returncode, "wall_s": round(wall, 2), "peak_rss_mb": round(rss_mb, 1)}))
    return 0


# -- data -------------------------------------------------------------------------------------------------
def augmented_folder(src: Path, dst: Path, count: int) -> Path:
    import cv2
    import numpy as np

    sources = sorted(p for p in src.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp", ".webp"))
    dst.mkdir(parents=True, exist_ok=True)
    cache: dict[Path, Any] = {}
    for i in range(count):
        path = sources[i % len(sources)]
        img = cache.get(path)
        if img is None:
            img = cache[path] = cv2.imread(str(path), cv2.IMREAD_COLOR)
        rng = np.random.default_rng(i)
        out = img[:, ::-1] if (i // len(sources)) % 2 else img
        h, w = out.shape[:2]
        ch, cw = int(h * rng.uniform(0.7, 1.0)), int(w * rng.uniform(0.7, 1.0))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        out = out[y:y + ch, x:x + cw].astype(np.float32)
        out = np.clip(out * rng.uniform(0.7, 1.3) + rng.uniform(-30, 30), 0, 255).astype(np.uint8)
        cv2.imwrite(str(dst / f"aug{i:04d}.jpg"), out, [cv2.IMWRITE_JPEG_QUALITY, 92])
    return dst


def first_images(src: Path, dst: Path, count: int) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir())[:count]:
        shutil.copy(p, dst / p.name)
    return dst


# -- parts -------------------------------------------------------------------------------------------------
def calibrate(model: Path, images: Path, out: Path, num: int, method: str,
              extra: list[str] | None = None) -> dict[str, Any]:
    cmd = [*EDGERT, "calibrate", str(model), "--images", str(images), "--num", str(num), "--method", method,
           "-o", str(out), "--no-check", "--force", "--json", *(extra or [])]
    info = measured(cmd)
    if info.get("rc") == 0:
        report = json.loads(info.pop("stdout"))
        info["report"] = {k: report[k] for k in ("summary", "timing_s", "peak_rss_mb", "method", "sensitivity")
                          if k in report}
        info["report"]["images_used"] = report["images"]["used"]
    return info


def compare(model: Path, candidate: Path, images: Path, video: Path, frames: int,
            report: Path | None) -> dict[str, Any]:
    cmd = [*EDGERT, "compare", str(model), str(candidate), "--images", str(images), "--video", str(video),
           "--frames", str(frames), "--json"]
    if report is not None:
        cmd += ["--skip-used", str(report)]
    info = measured(cmd)
    if info.get("rc") == 0:
        r = json.loads(info.pop("stdout"))
        info.update(frames=r["frames"], map50_95=r["map"]["map50_95"], map50=r["map"]["map50"],
                    strict_map50_95=r["map_strict"]["map50_95"], ground_truth=r["map"]["ground_truth"],
                    outputs=r["outputs"], reference_ms=r["reference_ms"], candidate_ms=r["candidate_ms"])
    return info


def rtx_build(path: Path) -> dict[str, Any]:
    code = (
        "import json,sys,time,tensorrt_rtx as trt\n"
        "lg=trt.Logger(trt.Logger.ERROR);b=trt.Builder(lg)\n"
        "n=b.create_network(1<<int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED));p=trt.OnnxParser(n,lg)\n"
        "ok=p.parse_from_file(sys.argv[1]);errs=[str(p.get_error(i)) for i in range(p.num_errors)]\n"
        "t=time.time();e=b.build_serialized_network(n,b.create_builder_config()) if ok else None\n"
        "print(json.dumps({'parsed':bool(ok),'errors':errs[:3],'built':e is not None,"
        "'engine_mb':round(e.nbytes/2**20,2) if e else None,'build_s':round(time.time()-t,2),"
        "'tensorrt_rtx':trt.__version__}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=600)
    try:
        out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return out
    except (IndexError, ValueError):
        return {"parsed": False, "errors": [proc.stderr.strip()[-500:]]}


ORT_CHILD = r'''
import json, sys, time
import numpy as np, onnx
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
from edgert.build.onnx_info import inspect_onnx
from edgert.calib.dataset import CalibrationImages
from edgert.calib.qdq import plan_quantization, prepare_model
from edgert.config import PreprocessConfig
from edgert.types import TensorSpec
from edgert.vision.preprocess import Preprocessor
model, images, num, method, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
fp32 = onnx.load(model)
prepared = prepare_model(fp32)
plan = plan_quantization(prepared)
first = inspect_onnx(model).inputs[0]  # the one image input (what edgert calibrate checks)
spec = TensorSpec(first.name, first.shape, np.dtype(np.float32))
pre = Preprocessor(PreprocessConfig(), spec, {p.key: p.value for p in fp32.metadata_props})
# the same nodes edgert leaves float: the decoding tail, the -inf padded ops, and the in-graph normalisation
exclude = sorted(set(plan.tail_nodes) | set(plan.skipped))
exclude += [n.name for n in prepared.graph.node if n.op_type == "Pad" and set(n.output) & plan.nonfinite_tensors]
class Reader(CalibrationDataReader):
    def __init__(self):
        self.it = iter(CalibrationImages(images, num=num, seed=0))
    def get_next(self):
        item = next(self.it, None)
        if item is None:
            return None
        buf = pre.allocate(); pre(item[1], buf)
        return {spec.name: buf}
onnx.save(prepared, out + ".prepared.onnx")
t = time.time()
quantize_static(out + ".prepared.onnx", out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_exclude=exclude,
                op_types_to_quantize=["Conv", "MatMul", "Gemm", "Add"],  # with MaxPool it collects the -inf pad
                calibrate_method=CalibrationMethod.Entropy if method == "entropy" else CalibrationMethod.MinMax,
                extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False})
print(json.dumps({"quantize_s": round(time.time() - t, 2), "excluded_nodes": len(exclude)}))
'''


def ort_quantize(model: Path, images: Path, num: int, method: str, out: Path) -> dict[str, Any]:
    info = measured([sys.executable, "-c", ORT_CHILD, str(model), str(images), str(num), method, str(out)])
    if info.get("rc") == 0:
        info.update(json.loads(info.pop("stdout").strip().splitlines()[-1]))
    return info


# -- main ---------------------------------------------------------------------------------------------------
def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure-child":
        return _measure_child(sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "edgert_bench_calibration")
    ap.add_argument("--images", type=Path, default=ASSETS / "images")
    ap.add_argument("--video", type=Path, default=ASSETS / "video/vtest.avi")
    ap.add_argument("--frames", type=int, default=50, help="video frames for the accuracy check")
    ap.add_argument("--num", type=int, default=32, help="calibration images")
    ap.add_argument("--big", type=int, default=500, help="images for the memory comparison")
    ap.add_argument("--ort-images", type=int, nargs="+", default=[32], help="image counts for ORT's calibrators")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--ort-models", nargs="+", default=["nanodet"], choices=list(MODELS),
                    help="models for quantize_static (yolov8s at 640 keeps several times NanoDet's ~98 MiB per image)")
    ap.add_argument("--memory-models", nargs="+", default=["nanodet"], choices=list(MODELS))
    ap.add_argument("--methods", nargs="+", default=["entropy", "percentile", "minmax"])
    ap.add_argument("--max-drop", type=float, default=None, help="also run mixed precision with this --max-drop")
    ap.add_argument("--mixed-method", default="percentile")
    ap.add_argument("--only", nargs="+", default=["accuracy", "memory", "ort", "rtx"],
                    choices=["accuracy", "memory", "ort", "rtx"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine_info(),
                               "num": args.num, "frames": args.frames}
    path = args.out / "bench_calibration.json"

    def save() -> None:
        path.write_text(json.dumps(results, indent=2, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="edgert-bench-") as tmp:
        available = sum(1 for p in args.images.iterdir() if p.is_file())
        big_folder: Path | None = None

        def folder_for(count: int) -> Path:
            """The asset folder, or the augmented one when it has fewer images than asked for."""
            nonlocal big_folder
            if count <= available:
                return args.images
            if big_folder is None:
                big_folder = augmented_folder(args.images, Path(tmp) / "aug", max(args.big, count))
            return big_folder

        if "accuracy" in args.only:
            acc = results.setdefault("accuracy", {})
            for name in args.models:
                for method in args.methods:
                    out = args.out / f"{name}.{method}.onnx"
                    cal = calibrate(MODELS[name], args.images, out, args.num, method)
                    report = args.out / f"{name}.{method}.report.json"
                    cmp = compare(MODELS[name], out, args.images, args.video, args.frames, report) \
                        if cal.get("rc") == 0 else {}
                    acc[f"{name}/{method}"] = {"calibrate": cal, "compare": cmp}
                    print(f"{name:8} {method:10} mAP@0.5:0.95 {cmp.get('map50_95')} (mAP@0.5 {cmp.get('map50')}, "
                          f"strict {cmp.get('strict_map50_95')}) on {cmp.get('frames')} frames; calibrate "
                          f"{cal.get('wall_s')} s, {cal.get('peak_rss_mb')} MiB", flush=True)
                    save()
                if args.max_drop is not None:
                    out = args.out / f"{name}.{args.mixed_method}.mixed.onnx"
                    cal = calibrate(MODELS[name], args.images, out, args.num, args.mixed_method,
                                    ["--max-drop", str(args.max_drop), "--check-video", str(args.video)])
                    cmp = compare(MODELS[name], out, args.images, args.video, args.frames,
                                  args.out / f"{name}.{args.mixed_method}.mixed.report.json") \
                        if cal.get("rc") == 0 else {}
                    acc[f"{name}/{args.mixed_method}+mixed"] = {"calibrate": cal, "compare": cmp}
                    sens = (cal.get("report") or {}).get("sensitivity") or {}
                    print(f"{name:8} mixed      mAP@0.5:0.95 {cmp.get('map50_95')} "
                          f"(strict {cmp.get('strict_map50_95')}) with {len(sens.get('float_layers', []))} layers "
                          f"float; calibrate {cal.get('wall_s')} s", flush=True)
                    save()
        if "memory" in args.only:
            mem = results.setdefault("memory", {})
            big = folder_for(args.big)
            mem["augmentation"] = f"{args.big} images from {args.images} by flip/crop/brightness, seeded per image"
            for name in args.memory_models:
                for count, folder in ((args.num, args.images), (args.big, big)):
                    out = Path(tmp) / f"{name}.mem{count}.onnx"
                    cal = calibrate(MODELS[name], folder, out, count, "entropy")
                    mem[f"{name}/{count}"] = {k: cal.get(k) for k in ("rc", "wall_s", "peak_rss_mb", "report")}
                    print(f"{name:8} entropy on {count:4} images: {cal.get('wall_s')} s, peak RSS "
                          f"{cal.get('peak_rss_mb')} MiB", flush=True)
                    save()
        if "ort" in args.only:
            ort = results.setdefault("onnxruntime_quantize_static", {})
            for name in args.ort_models:
                for count in args.ort_images:
                    for method in ("entropy", "minmax"):
                        out = Path(tmp) / f"{name}.ort.{method}.{count}.onnx"
                        q = ort_quantize(MODELS[name], folder_for(count), count, method, out)
                        entry: dict[str, Any] = {k: q.get(k) for k in ("rc", "wall_s", "peak_rss_mb", "quantize_s")}
                        if q.get("rc") != 0:
                            entry["error"] = (q.get("stderr") or q.get("error") or "")[-600:]
                        if q.get("rc") == 0:
                            # the same draw (folder, num, seed 0) as edgert's: its report names the images used
                            used = args.out / f"{name}.entropy.report.json"
                            cmp = compare(MODELS[name], out, args.images, args.video, args.frames,
                                          used if count == args.num and used.exists() else None)
                            entry["calibration_folder"] = str(folder_for(count))
                            entry["compare"] = {k: cmp.get(k) for k in ("map50_95", "map50", "strict_map50_95",
                                                                       "frames")}
                            if "rtx" in args.only:
                                entry["tensorrt_rtx"] = rtx_build(out)
                        ort[f"{name}/{method}/{count}"] = entry
                        print(f"{name:8} ORT {method:8} {count:4} images: {q.get('wall_s')} s, peak RSS "
                              f"{q.get('peak_rss_mb')} MiB, mAP@0.5:0.95 {(entry.get('compare') or {}).get('map50_95')}"
                              f" on {(entry.get('compare') or {}).get('frames')} frames", flush=True)
                        save()
        if "rtx" in args.only:
            rtx = results.setdefault("tensorrt_rtx", {})
            for qdq in sorted(args.out.glob("*.onnx")):
                rtx[qdq.name] = rtx_build(qdq)
                print(f"TensorRT-RTX {qdq.name}: {rtx[qdq.name]}", flush=True)
            for name in args.models:
                rtx[f"{name} (FP32)"] = rtx_build(MODELS[name])
                print(f"TensorRT-RTX {name} FP32: {rtx[f'{name} (FP32)']}", flush=True)
            save()
    save()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
