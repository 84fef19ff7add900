#!/usr/bin/env python3
"""What a part batch costs on ONNX Runtime CUDA, and why edgert keeps a session per size (issue 28, session 11).

For each detector (its batch made dynamic by edgert's checked rewrite), at ``--batch`` B (default 16):

1. ``one session, sizes alternating``: one ONNX Runtime CUDA session fed host arrays of B and 1 (then B, 2, B, 4)
   frames in turn: the cost of changing one session's input shape between calls;
2. ``a session per size``: edgert's GPU session at batch B with part batches allowed (``allow_part_batches``:
   a session per size 1, 2, 4, ... on the same stream and device buffers), ``use_rows`` then ``compute_only``
   in the same patterns; with the setup time and the GPU memory the part sessions took.

Prints the median milliseconds a call by size for each pattern and writes JSON. Needs onnxruntime-gpu, pycuda
and a GPU; elsewhere it says so in one line and exits 1.

    python3 scripts/bench_part_batches.py --out part_batches.json [--batch 16] [--calls 40]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from _bench import assets_dir, machine_info, write_json

MODELS = ("nanodet-m-416-coco-v8layout.onnx", "yolov8s-fall-640.onnx")
PATTERNS = {"B only": ("B",), "1 only": (1,), "B/1 alternating": ("B", 1), "B/2/B/4": ("B", 2, "B", 4)}


def _medians(call: Callable[[int], None], pattern: Sequence[int], calls: int) -> dict[str, Any]:
    """Median ms a call for each size of ``pattern``, run in turn ``calls`` times; and the slowest call."""
    times: dict[int, list[float]] = {}
    for k in range(calls):
        size = pattern[k % len(pattern)]
        t0 = time.perf_counter()
        call(size)
        times.setdefault(size, []).append((time.perf_counter() - t0) * 1e3)
    slowest = max(t for ts in times.values() for t in ts)
    return {"median_ms": {str(s): round(float(np.median(ts)), 2) for s, ts in times.items()},
            "slowest_ms": round(slowest, 1)}


def one_session(path: str, name: str, sample: tuple[int, ...], batch: int, calls: int) -> dict[str, Any]:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
    inputs = {size: np.zeros((size, *sample), np.float32) for size in {batch, 1, 2, 4}}
    for size in (batch, 1, 2, 4):  # every size seen once before timing
        sess.run(None, {name: inputs[size]})
    out = {}
    for label, raw in PATTERNS.items():
        pattern = [batch if s == "B" else int(s) for s in raw]
        out[label] = _medians(lambda size: sess.run(None, {name: inputs[size]}), pattern, calls)
    return out


def per_size(path: str, name: str, sample: tuple[int, ...], batch: int, calls: int) -> dict[str, Any]:
    from edgert.backends import SessionOptions, open_session
    from edgert.backends.cuda import pycuda_driver

    session = open_session(path, "onnxruntime-cuda", SessionOptions(shapes={name: (batch, *sample)}))
    driver = pycuda_driver()
    try:
        with session.device.active():
            session.compute_only()
            free = driver.mem_get_info()[0]
            t0 = time.perf_counter()
            sizes, why = session.allow_part_batches()
            for size in sizes:  # the warm-up the GPU processor makes: each size once
                session.use_rows(size)
                session.compute_only()
            out: dict[str, Any] = {"sizes": list(sizes), "why_not": why,
                                   "setup_s": round(time.perf_counter() - t0, 2),
                                   "part_sessions_mib": round((free - driver.mem_get_info()[0]) / 2**20)}

            def call(size: int) -> None:
                session.use_rows(size)
                session.compute_only()

            for label, raw in PATTERNS.items():
                out[label] = _medians(call, [batch if s == "B" else int(s) for s in raw], calls)
    finally:
        session.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--calls", type=int, default=40, help="calls per pattern")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--out", default="part_batches.json")
    args = ap.parse_args(argv)
    from edgert.backends import get_backend
    from edgert.errors import EdgertError
    from edgert.onnx_file import read_onnx
    from edgert.rewrite.batch import batched_model_path

    try:
        get_backend("onnxruntime-cuda")
    except EdgertError as exc:
        print(f"bench_part_batches: {exc}", file=sys.stderr)
        return 1
    results: dict[str, Any] = {"machine": machine_info(), "batch": args.batch, "calls": args.calls}
    for model in args.models:
        path = str(batched_model_path(assets_dir() / "models" / "detection" / model))
        spec = read_onnx(path, weights=False).graph.input[0]
        name = spec.name
        sample = tuple(int(d.dim_value) for d in spec.type.tensor_type.shape.dim[1:])
        row = {"one session, sizes alternating": one_session(path, name, sample, args.batch, args.calls),
               "a session per size": per_size(path, name, sample, args.batch, args.calls)}
        results[model] = row
        for way, figures in row.items():
            for label in PATTERNS:
                print(f"{model.split('-')[0]:8s} {way:32s} {label:16s} median ms by size "
                      f"{figures[label]['median_ms']} slowest {figures[label]['slowest_ms']}")
        per = row["a session per size"]
        print(f"{model.split('-')[0]:8s} part sessions {per['sizes']}: {per['setup_s']} s, "
              f"+{per['part_sessions_mib']} MiB of GPU memory")
    print(f"wrote {write_json(args.out, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
