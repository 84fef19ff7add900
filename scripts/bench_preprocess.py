#!/usr/bin/env python3
"""Measure edgert's preprocessing and decoding on real frames (video/vtest.avi) on this machine.

Preprocessing: ms/frame for 416 and 640 inputs (NCHW float32, NCHW float16, NHWC uint8), Python
allocation per frame measured with tracemalloc (steady state, and the peak of temporaries), against a
straightforward implementation (cv2 letterbox + numpy astype/transpose) run on the same frames.
Decoding: ms/frame of the YOLOv8-layout (nanodet) and YOLOv5-layout (yolov3-tiny) decoders on the real
outputs of those models, and the numpy NMS against OpenCV's ``cv2.dnn.NMSBoxesBatched`` on the same
candidates (equal results are checked).

    .venv/bin/python scripts/bench_preprocess.py [--frames 100] [--out out/bench_preprocess.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _bench import ROOT, assets_dir, machine_info

from edgert.config import DecodeConfig, PreprocessConfig
from edgert.types import TensorSpec
from edgert.vision.decoders import make_decoder
from edgert.vision.detector import Detector
from edgert.vision.nms import nms_indices_numpy, nms_indices_opencv
from edgert.vision.opened import concrete_output_specs
from edgert.vision.preprocess import Preprocessor


def checked_assets() -> Path:
    path = assets_dir()
    if not (path / "video" / "vtest.avi").exists():
        sys.exit(f"bench_preprocess: assets not found at {path}: set EDGERT_ASSETS")
    return path


def read_frames(path: Path, n: int) -> list[np.ndarray]:
    import cv2

    cap = cv2.VideoCapture(str(path))
    frames: list[np.ndarray] = []
    while len(frames) < n:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    return frames


def time_per_call(fn: Callable[[np.ndarray], Any], frames: list[np.ndarray], repeats: int = 5) -> dict[str, float]:
    """Median and best of ``repeats`` passes over the frames, in ms per frame."""
    for f in frames[:3]:
        fn(f)  # warm: scratch buffers, caches
    per_pass = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for f in frames:
            fn(f)
        per_pass.append((time.perf_counter() - t0) / len(frames) * 1e3)
    return {"ms_median": round(statistics.median(per_pass), 4), "ms_best": round(min(per_pass), 4)}


def allocation_per_call(fn: Callable[[np.ndarray], Any], frames: list[np.ndarray]) -> dict[str, float]:
    """Steady-state bytes kept per frame and the largest temporary, by tracemalloc."""
    for f in frames[:3]:
        fn(f)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for f in frames:
            fn(f)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {
        "bytes_kept_per_frame": round((after - before) / len(frames), 2),
        "peak_temporary_bytes": int(peak - before),
    }


def naive(frame: np.ndarray, size: int, dtype: str, layout: str) -> np.ndarray:
    """The usual tutorial preprocessing: a new array at every step."""
    import cv2

    h, w = frame.shape[:2]
    r = min(size / h, size / w)
    nw, nh = round(w * r), round(h * r)
    img = cv2.resize(frame, (nw, nh), interpolation=cv2.INTER_LINEAR)
    top, left = (size - nh) // 2, (size - nw) // 2
    img = cv2.copyMakeBorder(
        img, top, size - nh - top, left, size - nw - left, cv2.BORDER_CONSTANT, value=(114, 114, 114)
    )
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    x = img if dtype == "uint8" else img.astype(np.float32) / 255.0
    if layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x[None]).astype(dtype)


VARIANTS = [  # layout, dtype, config
    ("NCHW", "float32", PreprocessConfig()),
    ("NCHW", "float16", PreprocessConfig()),
    ("NHWC", "uint8", PreprocessConfig(scale=1.0)),
]


def bench_preprocess(frames: list[np.ndarray]) -> list[dict[str, Any]]:
    rows = []
    for size in (416, 640):
        for layout, dtype, cfg in VARIANTS:
            shape = (1, 3, size, size) if layout == "NCHW" else (1, size, size, 3)
            pre = Preprocessor(cfg, TensorSpec("images", shape, np.dtype(dtype)))
            out = pre.allocate()
            address = out.ctypes.data

            def ours(f: np.ndarray, pre: Preprocessor = pre, out: np.ndarray = out) -> None:
                pre(f, out)

            def theirs(f: np.ndarray, size: int = size, dtype: str = dtype, layout: str = layout) -> None:
                naive(f, size, dtype, layout)

            row: dict[str, Any] = {"size": size, "layout": layout, "dtype": dtype}
            row["edgert"] = {**time_per_call(ours, frames), **allocation_per_call(ours, frames)}
            row["edgert"]["same_output_buffer"] = out.ctypes.data == address
            row["edgert"]["opencv_conversion"] = pre._cv_depth is not None
            row["naive"] = {**time_per_call(theirs, frames), **allocation_per_call(theirs, frames)}
            row["speedup"] = round(row["naive"]["ms_median"] / row["edgert"]["ms_median"], 2)
            rows.append(row)
    return rows


def bench_decode(assets: Path, frames: list[np.ndarray]) -> list[dict[str, Any]]:
    import cv2

    rows = []
    models = [
        ("nanodet-m-416-coco-v8layout.onnx", "yolov8"),
        ("yolov3-tiny-coco-416.onnx", "yolov5"),
    ]
    for name, kind in models:
        with Detector(assets / "models" / "detection" / name) as det:
            samples = []  # (outputs copy, transform) of real frames
            for f in frames[:20]:
                tr = det.preprocess(f)
                outs = {k: v.copy() for k, v in det.session.infer().items()}
                samples.append((outs, tr))
            specs = concrete_output_specs(det.session)
        for conf in (0.25, 0.05):
            decoder = make_decoder(DecodeConfig(conf=conf), specs, {})
            it = iter(range(10**9))

            def decode(_: np.ndarray, decoder: Any = decoder, it: Any = it, samples: list[Any] = samples) -> None:
                outs, tr = samples[next(it) % len(samples)]
                decoder(outs, tr)

            timing = {
                **time_per_call(decode, frames[: len(samples)] * 5),
                **allocation_per_call(decode, frames[: len(samples)] * 2),
            }
            boxes = [len(decoder(o, t)) for o, t in samples]
            # NMS alone on the same candidates: edgert's numpy loop, edgert's OpenCV path (NMSBoxes on
            # class-offset boxes, the default when OpenCV is installed) and bare cv2.dnn.NMSBoxesBatched
            cands = [candidates(kind, o[next(iter(o))], conf) for o, _ in samples]
            agree = True
            t_np: list[float] = []
            t_ocv: list[float] = []
            t_cv: list[float] = []

            def timed(fn: Callable[[], np.ndarray], into: list[float]) -> np.ndarray:
                t0 = time.perf_counter()
                for _ in range(20):
                    kept = fn()
                into.append((time.perf_counter() - t0) / 20 * 1e3)
                return kept

            for xyxy, score, cls in cands:
                xywh = np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], axis=1).astype(np.float64)
                args = (xyxy, score, 0.45, cls, 300)
                keep_np = timed(lambda a=args: nms_indices_numpy(*a), t_np)  # type: ignore[misc]
                keep_ocv = timed(lambda a=args: nms_indices_opencv(*a), t_ocv)  # type: ignore[misc]
                batched = (xywh, score, cls, conf, 0.45)
                keep_cv = timed(
                    lambda b=batched: np.asarray(cv2.dnn.NMSBoxesBatched(*b)).reshape(-1),  # type: ignore[misc]
                    t_cv,
                )
                agree &= sorted(keep_np.tolist()) == sorted(keep_cv.tolist()) == sorted(keep_ocv.tolist())
            rows.append(
                {
                    "model": name,
                    "decoder": kind,
                    "conf": conf,
                    "decode": timing,
                    "boxes_per_frame_mean": round(float(np.mean(boxes)), 2),
                    "nms_candidates_mean": round(float(np.mean([len(c[1]) for c in cands])), 1),
                    "nms_numpy_ms_median": round(statistics.median(t_np), 4),
                    "nms_edgert_opencv_ms_median": round(statistics.median(t_ocv), 4),
                    "nms_opencv_batched_ms_median": round(statistics.median(t_cv), 4),
                    "nms_same_boxes": bool(agree),
                }
            )
    return rows


def candidates(kind: str, out: np.ndarray, conf: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The boxes a decoder hands to NMS: above ``conf``, best class, xyxy in input pixels."""
    if kind == "yolov8":
        a = out[0]
        scores = a[4:]
        best = scores.max(axis=0)
        idx = np.flatnonzero(best > conf)
        cls = scores[:, idx].argmax(axis=0).astype(np.int32)
        score, b = best[idx].astype(np.float32), a[:4, idx].T
    else:
        a = out[0][out[0][:, 4] > conf]
        s = a[:, 5:] * a[:, 4:5]
        cls = s.argmax(axis=1).astype(np.int32)
        score = s[np.arange(len(cls)), cls].astype(np.float32)
        keep = score > conf
        a, cls, score = a[keep], cls[keep], score[keep]
        b = a[:, :4]
    xyxy = np.concatenate([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], axis=1).astype(np.float32)
    return xyxy, score, cls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100, help="vtest frames to use (default 100)")
    parser.add_argument("--out", default=str(ROOT / "out" / "bench_preprocess.json"), help="JSON result path")
    parser.add_argument("--skip-decode", action="store_true", help="preprocessing only (no ONNX Runtime needed)")
    args = parser.parse_args()

    import cv2

    assets = checked_assets()
    frames = read_frames(assets / "video" / "vtest.avi", args.frames)
    result: dict[str, Any] = {
        "machine": {
            **machine_info(),
            "numpy": np.__version__,
            "opencv": cv2.__version__,
            "opencv_threads": cv2.getNumThreads(),
        },
        "frames": len(frames),
        "frame_size": list(frames[0].shape),
        "preprocess": bench_preprocess(frames),
    }
    if not args.skip_decode:
        result["decode"] = bench_decode(assets, frames)

    print(f"preprocessing, {len(frames)} vtest frames {frames[0].shape[1]}x{frames[0].shape[0]} -> model input")
    print(f"{'input':<22}{'edgert ms':>10}{'naive ms':>10}{'speedup':>9}{'B kept/frame':>14}{'peak tmp B':>12}")
    for r in result["preprocess"]:
        e, n = r["edgert"], r["naive"]
        label = f"{r['size']} {r['layout']} {r['dtype']}"
        print(
            f"{label:<22}{e['ms_median']:>10.3f}{n['ms_median']:>10.3f}{r['speedup']:>9.2f}"
            f"{e['bytes_kept_per_frame']:>14.1f}{e['peak_temporary_bytes']:>12d}"
        )
    for r in result.get("decode", []):
        print(
            f"decode {r['decoder']:<7} {r['model']:<36} conf {r['conf']:<5} {r['decode']['ms_median']:.3f} ms/frame "
            f"(peak temporary {r['decode']['peak_temporary_bytes']} B), "
            f"{r['nms_candidates_mean']} candidates -> {r['boxes_per_frame_mean']} boxes; NMS ms: numpy "
            f"{r['nms_numpy_ms_median']:.3f}, edgert+OpenCV {r['nms_edgert_opencv_ms_median']:.3f}, "
            f"NMSBoxesBatched {r['nms_opencv_batched_ms_median']:.3f} (same boxes: {r['nms_same_boxes']})"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
