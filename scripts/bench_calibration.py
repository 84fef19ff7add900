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
   biases, the same tail and -inf padding excluded, fed the same preprocessed tensors: the ``.npz`` of
   5., held in memory, 2 MiB per NanoDet image, counted in its peak RSS) with its entropy and min-max
   calibrators, time and peak RSS, evaluated on the same held-out frames as 5. Its entropy calibrator
   keeps every activation of every image (~98 MiB per image on NanoDet), so it runs on ``--ort-images``
   (default 32; 500 would need ~48 GiB on a 24 GiB machine).
4. TensorRT-RTX (when ``tensorrt_rtx`` imports): parse and build each Q/DQ model as a strongly typed
   network on the CPU.
5. tools (side by side): NVIDIA ModelOpt (``python -m modelopt.onnx.quantization``, its default, INT8
   with entropy calibration, and ``--calibration_method max``), ONNX Runtime's ``quantize_static``
   (entropy and min-max, as in 3.) and the default ``edgert calibrate``, on the same data: the 32 images
   of edgert's draw (seed 0) through the vision pipeline's own ``Preprocessor``, written once as an
   ``.npz`` keyed by the input name (ModelOpt's ``--calibration_data_path`` reads it, and so does the ORT
   reader). Each Q/DQ model is evaluated with ``compare_detectors`` on held-out frames
   (the folder's images the draw did not use, then ``--frames`` frames of ``--video``), timed and
   measured for peak RSS in its own process, and parsed/built with TensorRT-RTX. ModelOpt needs torch,
   so it is installed into a throwaway venv (``--modelopt-venv``, reused when it imports), never into
   edgert's; ``--modelopt-torch`` picks the torch build (PyPI's Linux wheel pulls CUDA libraries; a
   CPU build is enough: the INT8 ONNX path only imports torch). Prints a methods x models table.

    .venv/bin/python scripts/bench_calibration.py --out /tmp/bench_calib            # everything
    .venv/bin/python scripts/bench_calibration.py --only memory --models nanodet    # one part
    .venv/bin/python scripts/bench_calibration.py --only tools rtx --json docs/results/calibration-tools.json \
        --modelopt-torch 'torch==2.13.0+cpu'                                        # side by side
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _bench import ROOT, assets_dir, machine_info, write_json
from _quant_tools import measured, modelopt_env, modelopt_quantize

ASSETS = assets_dir()
MODELS = {
    "nanodet": ASSETS / "models/detection/nanodet-m-416-coco-v8layout.onnx",
    "yolov8s": ASSETS / "models/detection/yolov8s-fall-640.onnx",
    "yolov3tiny": ASSETS / "models/detection/yolov3-tiny-coco-416.onnx",  # not tuned on
}
EDGERT = [sys.executable, "-m", "edgert.cli.main"]


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


# The calibration data every tool gets: edgert's draw (CalibrationImages, seed 0) through the vision
# pipeline's own Preprocessor, exactly what ``edgert calibrate`` feeds its collector, stacked along the
# batch axis in one .npz keyed by the input name (ModelOpt's CalibrationDataProvider splits it back into
# batches of the model's batch size). Also prints the files the draw used: the held-out frames leave them out.
DATA_CHILD = r"""
import json, sys
import numpy as np, onnx
from edgert.builder.onnx_info import inspect_onnx
from edgert.calib.dataset import CalibrationImages
from edgert.config import PipelineConfig
from edgert.types import TensorSpec
from edgert.vision.preprocess import Preprocessor
model, images, num, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
first = inspect_onnx(model).inputs[0]  # the one image input (what edgert calibrate checks)
spec = TensorSpec(first.name, first.shape, np.dtype(np.float32))
meta = {p.key: p.value for p in onnx.load(model, load_external_data=False).metadata_props}
pre = Preprocessor(PipelineConfig().preprocess, spec, meta)  # edgert calibrate's default config
draw = CalibrationImages(images, num=num, seed=0)
batch = []
for _, image in draw:
    buf = pre.allocate(); pre(image, buf); batch.append(buf)
data = np.concatenate(batch, axis=0)
np.savez(out, **{spec.name: data})
print(json.dumps({"input": spec.name, "shape": list(data.shape), "used_files": [str(p) for p in draw.used]}))
"""


def calibration_data(model: Path, images: Path, num: int, out: Path) -> dict[str, Any]:
    """Write the preprocessed calibration tensors of ``model`` to ``out`` (.npz); the draw's used files."""
    proc = subprocess.run([sys.executable, "-c", DATA_CHILD, str(model), str(images), str(num), str(out)],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"calibration data for {model.name} failed: {proc.stderr[-2000:]}")
    info: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    info["npz"] = str(out)
    return info


ORT_CHILD = r"""
import json, sys, time
import numpy as np, onnx
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
from edgert.calib.qdq import plan_quantization, prepare_model
model, npz, method, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
fp32 = onnx.load(model)
prepared = prepare_model(fp32)
plan = plan_quantization(prepared)
# the same nodes edgert leaves float: the decoding tail, the -inf padded ops, and the in-graph normalisation
exclude = sorted(set(plan.tail_nodes) | set(plan.skipped))
exclude += [n.name for n in prepared.graph.node if n.op_type == "Pad" and set(n.output) & plan.nonfinite_tensors]
with np.load(npz) as f:
    (name, data), = f.items()  # the calibration_data tensors: one input, images along the batch axis
class Reader(CalibrationDataReader):
    def __init__(self):
        self.it = iter(range(len(data)))
    def get_next(self):
        i = next(self.it, None)
        return None if i is None else {name: data[i:i + 1]}
onnx.save(prepared, out + ".prepared.onnx")
t = time.time()
quantize_static(out + ".prepared.onnx", out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_exclude=exclude,
                op_types_to_quantize=["Conv", "MatMul", "Gemm", "Add"],  # with MaxPool it collects the -inf pad
                calibrate_method=CalibrationMethod.Entropy if method == "entropy" else CalibrationMethod.MinMax,
                extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False})
print(json.dumps({"quantize_s": round(time.time() - t, 2), "excluded_nodes": len(exclude)}))
"""


def ort_quantize(model: Path, npz: Path, method: str, out: Path) -> dict[str, Any]:
    info = measured([sys.executable, "-c", ORT_CHILD, str(model), str(npz), method, str(out)])
    if info.get("rc") == 0:
        info.update(json.loads(info.pop("stdout").strip().splitlines()[-1]))
    return info


# What the held-out evaluation measures, for any Q/DQ model: compare_detectors against FP32 (ONNX Runtime CPU) on the
# folder's images the draw did not use, then ``frames`` frames of the video.
EVAL_CHILD = r"""
import json, sys
from pathlib import Path
from edgert.calib.comparison import compare_detectors, evaluation_frames
src, cand, images, video, frames, used = sys.argv[1:7]
held = evaluation_frames(images, video or None, int(frames), [Path(p) for p in json.loads(Path(used).read_text())])
r = compare_detectors(src, cand, held)
print(json.dumps({"frames": r["frames"], "map50_95": r["map"]["map50_95"], "map50": r["map"]["map50"],
                  "strict_map50_95": r["map_strict"]["map50_95"], "ground_truth": r["map"]["ground_truth"],
                  "reference_ms": r["reference_ms"], "candidate_ms": r["candidate_ms"]}))
"""


def evaluate(model: Path, candidate: Path, images: Path, video: Path | None, frames: int,
             used: Path) -> dict[str, Any]:
    """Held-out mAP of ``candidate`` against ``model`` (``used``: JSON list of the calibration's files)."""
    info = measured([sys.executable, "-c", EVAL_CHILD, str(model), str(candidate), str(images), str(video or ""),
                     str(frames), str(used)])
    if info.get("rc") == 0:
        info.update(json.loads(info.pop("stdout").strip().splitlines()[-1]))
    else:
        info["error"] = (info.get("stderr") or info.get("error") or "")[-1500:]
    return info


def carry_metadata(src: Path, out: Path) -> list[str]:
    """Copy the FP32 model's metadata_props that ``out`` lacks (class names, preprocessing keys the Detector
    reads); returns their keys. edgert's and ORT's outputs keep them; a tool that drops them would
    otherwise be evaluated with other class names or preprocessing."""
    import onnx

    ref = {p.key: p.value for p in onnx.load(str(src), load_external_data=False).metadata_props}
    model = onnx.load(str(out))
    have = {p.key for p in model.metadata_props}
    missing = [k for k in ref if k not in have]
    if missing:
        onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                            **{k: ref[k] for k in missing}})
        onnx.save(model, str(out))
    return missing


def qdq_summary(path: Path) -> dict[str, Any]:
    """How a Q/DQ model is made: Q/DQ node counts, the ops that run on Q/DQ'd inputs, the float type."""
    import onnx

    model = onnx.load(str(path))
    nodes = model.graph.node
    dq_out = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
    fed = sorted({n.op_type for n in nodes if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
                  and set(n.input) & dq_out})
    types = sorted({onnx.TensorProto.DataType.Name(i.data_type) for i in model.graph.initializer})
    sys.path.insert(0, str(ROOT))
    from edgert.calib.macs import count_macs

    macs = count_macs(model)
    return {"int8_mac_share": round(macs.share, 4), "int8_layers": len(macs.int8), "weighted_layers": len(macs.layers),
            "quantize_linear": sum(n.op_type == "QuantizeLinear" for n in nodes),
            "dequantize_linear": sum(n.op_type == "DequantizeLinear" for n in nodes),
            "ops_on_dq": fed, "initializer_types": types, "mb": round(path.stat().st_size / 2**20, 2)}


def edgert_commit() -> str:
    """The commit of the edgert that ran (``+dirty`` when its files differ from it)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    return head + ("+dirty" if git("status", "--porcelain", "--", "edgert") else "")


def tools_table(rows: dict[str, dict[str, Any]], models: list[str], tools: list[str]) -> str:
    """The methods x models table (markdown): held-out mAP@0.5:0.95 (strict), time, peak RSS, RTX build."""
    def cell(e: dict[str, Any] | None) -> str:
        if not e:
            return "not run"
        if e.get("skipped"):
            return "not run (memory)"
        if e.get("error"):
            return "failed: " + str(e["error"]).strip().splitlines()[-1][:80] if str(e["error"]).strip() \
                else "failed"
        ev = e.get("eval") or {}
        rtx = e.get("tensorrt_rtx") or {}
        mb = f" {rtx['engine_mb']} MB" if rtx.get("engine_mb") is not None else ""
        built = "" if not rtx else (f", RTX built{mb}" if rtx.get("built") else ", RTX not built")
        share = (e.get("qdq") or {}).get("int8_mac_share")
        built = (f", INT8 MACs {100 * share:.0f} %" if isinstance(share, float) else "") + built
        m, st = ev.get("map50_95"), ev.get("strict_map50_95")
        acc = f"{m:.3f} ({st:.3f})" if isinstance(m, float) and isinstance(st, float) else "no eval"
        return f"{acc}, {e.get('wall_s')} s, {e.get('peak_rss_mb'):.0f} MiB{built}" \
            if isinstance(e.get("peak_rss_mb"), (int, float)) else acc
    head = "| tool | " + " | ".join(models) + " |\n|---|" + "---|" * len(models) + "\n"
    return head + "".join(f"| {TOOLS[t]} | " + " | ".join(cell(rows.get(f"{m}/{t}")) for m in models) + " |\n"
                          for t in tools)


def ratios(side: dict[str, dict[str, Any]], models: list[str]) -> dict[str, dict[str, float | None]]:
    """edgert default / ModelOpt default per model, from this run: wall time and TensorRT-RTX engine size."""
    out: dict[str, dict[str, float | None]] = {}
    for name in models:
        e, m = side.get(f"{name}/edgert") or {}, side.get(f"{name}/modelopt") or {}

        def ratio(a: Any, b: Any) -> float | None:
            return round(float(a) / float(b), 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
                and b else None
        out[name] = {"wall": ratio(e.get("wall_s"), m.get("wall_s")),
                     "engine": ratio((e.get("tensorrt_rtx") or {}).get("engine_mb"),
                                     (m.get("tensorrt_rtx") or {}).get("engine_mb"))}
    return out


#: ModelOpt's command-line arguments per row (after --quantize_mode int8 and the data)
MODELOPT_ARGS = {"modelopt": [], "modelopt-max": ["--calibration_method", "max"],
                 "modelopt-fp32": ["--high_precision_dtype", "fp32"]}

#: the tools of the side-by-side part, in table order, and what each row is
TOOLS = {
    "modelopt": "ModelOpt 0.47 default (int8, entropy; float layers in FP16)",
    "modelopt-max": "ModelOpt --calibration_method max",
    "modelopt-fp32": "ModelOpt default, --high_precision_dtype fp32",
    "ort-entropy": "ORT quantize_static, entropy",
    "ort-minmax": "ORT quantize_static, min-max",
    "edgert": "edgert calibrate (default)",
}


# -- main ---------------------------------------------------------------------------------------------------
def main() -> int:
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
    ap.add_argument("--only", nargs="+", default=["accuracy", "memory", "ort", "tools", "rtx"],
                    choices=["accuracy", "memory", "ort", "tools", "rtx"])
    ap.add_argument("--tools", nargs="+", default=list(TOOLS), choices=list(TOOLS),
                    help="rows of the side-by-side part (default all)")
    ap.add_argument("--tools-models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--ort-entropy-models", nargs="+", default=["nanodet"], choices=list(MODELS),
                    help="models for ORT's entropy row (on yolov8s at 640 it would hold ~250 MiB of activations "
                         "per image, ~12 GiB for 32)")
    ap.add_argument("--modelopt-venv", type=Path, default=Path.home() / ".cache/edgert-bench/modelopt-venv",
                    help="throwaway venv for ModelOpt (created when missing, reused when it imports)")
    ap.add_argument("--modelopt-spec", default="nvidia-modelopt[onnx]==0.47.0")
    ap.add_argument("--modelopt-torch", default="torch",
                    help="torch for that venv, installed first (e.g. 'torch==2.13.0+cpu' where pip finds a CPU "
                         "build; PyPI's Linux wheel brings CUDA libraries)")
    ap.add_argument("--json", type=Path, help="also write the results here (e.g. docs/results/...)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine_info(),
                               "num": args.num, "frames": args.frames}
    path = args.out / "bench_calibration.json"

    def save() -> None:
        path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        if args.json is not None:
            write_json(args.json, results)

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
        data: dict[tuple[str, int], dict[str, Any]] = {}

        def data_for(name: str, count: int) -> dict[str, Any]:
            """The preprocessed tensors of the seed-0 draw of ``count`` images, and the JSON list of its files."""
            if (name, count) not in data:
                d = calibration_data(MODELS[name], folder_for(count), count, Path(tmp) / f"{name}.{count}.npz")
                used = Path(tmp) / f"{name}.{count}.used.json"
                used.write_text(json.dumps(d["used_files"]))
                d["used_json"] = used
                data[(name, count)] = d
            return data[(name, count)]

        def held_out(name: str, count: int) -> Path:
            """Files to leave out of the evaluation: those of the draw at ``--num`` from the asset folder (an
            augmented folder's images are not the asset files, so its draws exclude the same ones)."""
            return Path(data_for(name, count if folder_for(count) == args.images else args.num)["used_json"])

        if "ort" in args.only:
            ort = results.setdefault("onnxruntime_quantize_static", {})
            for name in args.ort_models:
                for count in args.ort_images:
                    for method in ("entropy", "minmax"):
                        out = Path(tmp) / f"{name}.ort.{method}.{count}.onnx"
                        q = ort_quantize(MODELS[name], Path(data_for(name, count)["npz"]), method, out)
                        entry: dict[str, Any] = {k: q.get(k) for k in ("rc", "wall_s", "peak_rss_mb", "quantize_s")}
                        if q.get("rc") != 0:
                            entry["error"] = (q.get("stderr") or q.get("error") or "")[-600:]
                        if q.get("rc") == 0:
                            cmp = evaluate(MODELS[name], out, args.images, args.video, args.frames,
                                           held_out(name, count))
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
        if "tools" in args.only:
            side = results.setdefault("tools", {})
            meta = results.setdefault("tools_setup", {"edgert_commit": edgert_commit(), "num": args.num,
                                                      "seed": 0, "frames": args.frames,
                                                      "images": str(args.images), "video": str(args.video)})
            if any(t.startswith("modelopt") for t in args.tools):
                meta["modelopt"] = modelopt_env(args.modelopt_venv, args.modelopt_spec, args.modelopt_torch)
                print(f"ModelOpt venv: {meta['modelopt']}", flush=True)
                save()
            for name in args.tools_models:
                d = data_for(name, args.num)
                meta[f"{name}/data"] = {k: d[k] for k in ("input", "shape", "npz")}
                for tool in args.tools:
                    out = args.out / f"{name}.tool.{tool}.onnx"
                    entry = {}
                    if tool.startswith("modelopt"):
                        if meta["modelopt"].get("error"):
                            side[f"{name}/{tool}"] = {"error": "ModelOpt not installed: " + meta["modelopt"]["error"]}
                            continue
                        entry = modelopt_quantize(args.modelopt_venv, MODELS[name], Path(d["npz"]), out,
                                                  Path(tmp) / f"modelopt-{name}-{tool}", MODELOPT_ARGS[tool])
                    elif tool == "ort-entropy" and name not in args.ort_entropy_models:
                        side[f"{name}/{tool}"] = {"skipped": "not in --ort-entropy-models: its calibrator keeps "
                                                  "every activation of every image (see --ort-models)"}
                        continue
                    elif tool.startswith("ort-"):
                        q = ort_quantize(MODELS[name], Path(d["npz"]), tool[4:], out)
                        entry = {k: q.get(k) for k in ("rc", "wall_s", "peak_rss_mb", "quantize_s", "excluded_nodes")}
                        if q.get("rc") != 0:
                            entry["error"] = (q.get("stderr") or q.get("error") or "")[-1500:]
                    else:  # the default edgert calibrate: no --method, the mixed-precision check on
                        # --no-strict: a missed accuracy target exits 3; the model is written and measured anyway
                        cal = measured([*EDGERT, "calibrate", str(MODELS[name]), "--images", str(args.images),
                                        "--num", str(args.num), "-o", str(out), "--force", "--json", "--no-strict"])
                        entry = {k: cal.get(k) for k in ("rc", "wall_s", "peak_rss_mb")}
                        if cal.get("rc") == 0:
                            rep = json.loads(cal["stdout"])
                            entry.update(method=rep.get("method"), summary=rep.get("summary"),
                                         verdict=rep.get("verdict"), timing_s=rep.get("timing_s"),
                                         float_layers=rep.get("float_layers"))
                            if sorted(rep["images"]["used_files"]) != sorted(d["used_files"]):
                                entry["warning"] = "edgert's draw differs from the data the other tools got"
                        else:
                            entry["error"] = (cal.get("stderr") or cal.get("error") or "")[-1500:]
                    if not entry.get("error") and out.exists():
                        entry["metadata_added"] = carry_metadata(MODELS[name], out)
                        entry["qdq"] = qdq_summary(out)
                        entry["eval"] = evaluate(MODELS[name], out, args.images, args.video, args.frames,
                                                 Path(d["used_json"]))
                        if "rtx" in args.only:
                            entry["tensorrt_rtx"] = rtx_build(out)
                    side[f"{name}/{tool}"] = entry
                    ev = entry.get("eval") or {}
                    print(f"{name:8} {tool:13} mAP@0.5:0.95 {ev.get('map50_95')} (strict {ev.get('strict_map50_95')}) "
                          f"on {ev.get('frames')} frames; {entry.get('wall_s')} s, {entry.get('peak_rss_mb')} MiB"
                          f"{'; ' + str(entry['error'])[-300:] if entry.get('error') else ''}", flush=True)
                    save()
            table = tools_table(side, args.tools_models, args.tools)
            results["tools_table"] = table
            print(table, flush=True)
            results["ratios"] = ratios(side, args.tools_models)
            for name, r in results["ratios"].items():
                print(f"{name:8} edgert / ModelOpt default, same run: wall time {r.get('wall')}, "
                      f"TensorRT-RTX engine {r.get('engine')}", flush=True)
        if "rtx" in args.only:
            rtx = results.setdefault("tensorrt_rtx", {})
            for qdq in sorted(q for q in args.out.glob("*.onnx") if ".tool." not in q.name):  # tools: built above
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
