#!/usr/bin/env python3
"""FP16 against FP32 on ONNX Runtime: detections agreement (mAP) and compute-only speed, per detector.

For each model: ``edgert convert --precision fp16`` (edgert.rewrite.fp16), then

1. accuracy: both models through edgert's own Detector (same preprocessing and decoding) on every image
   of ``--images`` plus ``--frames`` frames of ``--video``; mAP@0.5:0.95 of the FP16 detections against
   the FP32 ones (conf 0.25 for FP32, FP16 boxes down to 0.001, as ``edgert compare`` does);
2. speed, compute only: ``session.run`` on one preprocessed frame, no preprocessing or decoding. With
   ``--provider cuda`` the input and outputs stay on the GPU (I/O binding), so host copies are not timed
   either; ``--warmup`` runs, then ``--iters`` runs; FPS = iters / seconds, median latency beside it.

Prints a table and writes ``--out`` (JSON). Needs onnxruntime-gpu for ``cuda`` (Python 3.12 is fine),
onnxconverter-common (pip install 'edgert[fp16]') and OpenCV.

    python scripts/bench_fp16.py --provider cuda --out fp16_cuda.json
    python scripts/bench_fp16.py --provider cpu --max-images 4 --frames 4 --iters 5 --out /tmp/fp16_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import assets_dir

ASSETS = assets_dir()
MODELS = {
    "nanodet": ASSETS / "models/detection/nanodet-m-416-coco-v8layout.onnx",
    "yolov8s": ASSETS / "models/detection/yolov8s-fall-640.onnx",
}
BACKENDS = {"cuda": "onnxruntime-cuda", "cpu": "onnxruntime"}


def frames(images: Path, video: Path | None, count: int, max_images: int) -> list[tuple[str, Any]]:
    from edgert.calib.comparison import evaluation_frames

    out = []
    imgs = list(evaluation_frames(images))[:max_images] if max_images else list(evaluation_frames(images))
    out += imgs
    if video is not None and count > 0:
        out += list(evaluation_frames(None, video, count))
    return out


def compute_speed(model: Path, provider: str, warmup: int, iters: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    providers = ["CUDAExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(model), opts, providers=providers)
    if provider == "cuda" and "CUDAExecutionProvider" not in sess.get_providers():
        raise SystemExit(f"ONNX Runtime did not enable CUDA (providers {sess.get_providers()}); "
                         "install onnxruntime-gpu matching this CUDA")
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    if provider == "cuda":
        binding = sess.io_binding()
        binding.bind_ortvalue_input(inp.name, ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
        for o in sess.get_outputs():
            binding.bind_output(o.name, "cuda", 0)

        def once() -> None:
            sess.run_with_iobinding(binding)
            binding.synchronize_outputs()
    else:
        def once() -> None:
            sess.run(None, {inp.name: x})
    for _ in range(warmup):
        once()
    times = []
    t_all = time.perf_counter()
    for _ in range(iters):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_all
    return {"fps": round(iters / total, 2), "median_ms": round(1000 * statistics.median(times), 3),
            "iters": iters, "input": shape}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", choices=tuple(BACKENDS), default="cuda")
    ap.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    ap.add_argument("--images", type=Path, default=ASSETS / "images")
    ap.add_argument("--video", type=Path, default=ASSETS / "video/vtest.avi")
    ap.add_argument("--frames", type=int, default=50, help="frames of --video (default 50)")
    ap.add_argument("--max-images", type=int, default=0, help="at most this many images (0: all)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--work", type=Path, help="folder for the FP16 models (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=Path("bench_fp16.json"))
    args = ap.parse_args()

    from edgert.calib.comparison import compare_detectors
    from edgert.rewrite.fp16 import convert_file

    work = args.work or Path(tempfile.mkdtemp(prefix="edgert-fp16-"))
    work.mkdir(parents=True, exist_ok=True)
    evaluation = frames(args.images, args.video if args.video.is_file() else None, args.frames, args.max_images)
    import onnxruntime as ort

    result: dict[str, Any] = {"provider": args.provider, "onnxruntime": ort.__version__,
                              "python": platform.python_version(), "frames": len(evaluation), "models": {}}
    for name in args.models:
        src = MODELS[name]
        dst = work / f"{src.stem}.fp16.onnx"
        t0 = time.perf_counter()
        conversion = convert_file(src, dst)
        conversion["seconds"] = round(time.perf_counter() - t0, 2)
        acc = compare_detectors(src, dst, evaluation, backend=BACKENDS[args.provider])
        fp32 = compute_speed(src, args.provider, args.warmup, args.iters)
        fp16 = compute_speed(dst, args.provider, args.warmup, args.iters)
        entry = {"conversion": conversion, "map50_95": acc["map"]["map50_95"], "map50": acc["map"]["map50"],
                 "map50_95_strict": acc["map_strict"]["map50_95"], "reference_boxes": acc["map"]["ground_truth"],
                 "fp32": fp32, "fp16": fp16, "speedup": round(fp16["fps"] / fp32["fps"], 3)}
        result["models"][name] = entry
        print(f"{name}: mAP@0.5:0.95 FP16 vs FP32 {entry['map50_95']} (strict {entry['map50_95_strict']}, "
              f"{entry['reference_boxes']} boxes); compute-only FP32 {fp32['fps']} fps, FP16 {fp16['fps']} fps "
              f"({entry['speedup']}x)", flush=True)
    print(f"\n| model | mAP@0.5:0.95 FP16 vs FP32 | FP32 fps ({args.provider}) | FP16 fps | FP16/FP32 |")
    print("|---|---|---|---|---|")
    for name, e in result["models"].items():
        print(f"| {name} | {e['map50_95']} | {e['fp32']['fps']} | {e['fp16']['fps']} | {e['speedup']} |")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
