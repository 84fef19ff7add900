#!/usr/bin/env python3
"""Where a TensorRT 8.x build's time goes: one detector built with TensorRT's own API at one precision, once per
set of tactic sources (each in its own process, at the same time), then each engine's latency (batch 1 and 16).

TensorRT 8.5 builds yolov3-tiny FP16 in about 4 minutes of CPU on an H100, with cuBLAS/cuDNN already off (edgert
turns them off on 8.x). Its JIT convolutions (``TacticSource.JIT_CONVOLUTIONS``, on by default, "engine building
time may increase", TensorRT's API reference) and edge-mask convolutions are the other sources; this measures
what each costs in build time and what leaving it out costs in engine latency, so edgert's default for 8.x is
chosen on both axes.

    python scripts/bench_trt_build.py --model yolov3-tiny-coco-416.onnx --out trt-build.json
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from _bench import assets_dir, machine_info, write_json

# each variant: the tactic sources left out beyond cuBLAS/cuDNN (which edgert leaves out on TensorRT 8.x)
SOURCES: dict[str, tuple[str, ...]] = {"default": (), "no-jit": ("JIT_CONVOLUTIONS",),
                                       "no-jit-no-edge": ("JIT_CONVOLUTIONS", "EDGE_MASK_CONVOLUTIONS")}


def build(model: Path, precision: str, variant: str, out: Path, opt: int, top: int) -> dict[str, Any]:
    import tensorrt as trt

    from edgert.cli.bench import batch_inputs

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model)):
        return {"error": str(parser.get_error(0))}
    config = builder.create_builder_config()
    sources = int(config.get_tactic_sources())
    for name in ("CUBLAS", "CUBLAS_LT", "CUDNN", *SOURCES[variant]):
        member = getattr(trt.TacticSource, name, None)
        if member is not None:
            sources &= ~(1 << int(member))
    config.set_tactic_sources(sources)
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif precision == "int8":
        config.set_flag(trt.BuilderFlag.FP16)
        config.set_flag(trt.BuilderFlag.INT8)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    rest = batch_inputs(model, [])
    profile = builder.create_optimization_profile()
    for k, r in rest.items():
        profile.set_shape(k, trt.Dims([1, *r]), trt.Dims([opt, *r]), trt.Dims([top, *r]))
    config.add_optimization_profile(profile)
    t0 = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    took = time.perf_counter() - t0
    if plan is None:
        return {"error": "build failed", "build_s": round(took, 1)}
    out.write_bytes(bytes(plan))
    return {"build_s": round(took, 1), "engine_mb": round(out.stat().st_size / 1e6, 2), "engine": str(out),
            "inputs": {k: list(r) for k, r in rest.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="yolov3-tiny-coco-416.onnx", help="a detector of the assets, or a path")
    ap.add_argument("--precision", choices=("fp32", "fp16", "int8"), default="fp16")
    ap.add_argument("--variants", default=",".join(SOURCES))
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--engines", type=Path, default=Path("/tmp/edgert-trt-build"))
    ap.add_argument("--out", type=Path, default=Path("trt-build.json"))
    ap.add_argument("--phase", choices=("build", "measure", "all"), default="all",
                    help="build: the engines only (at the same time as other work); measure: their latency, later, "
                         "on an otherwise idle GPU")
    args = ap.parse_args()
    from bench_trt_int8 import measure

    from edgert.rewrite.batch import batched_model_path

    src = Path(args.model) if Path(args.model).is_file() else assets_dir() / "models" / "detection" / args.model
    model = batched_model_path(src)
    args.engines.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",")
    data: dict[str, Any] = {"machine": machine_info(), "model": src.name, "precision": args.precision,
                            "profile": "1..32, tuned for 16", "variants": {}}
    if args.phase == "measure":
        data = json.loads(args.out.read_text())
    else:
        with ProcessPoolExecutor(len(variants), mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(build, model, args.precision, v, args.engines / f"{src.stem}.{v}.engine", 16, 32):
                       v for v in variants}
            for fut in as_completed(futures):
                data["variants"][futures[fut]] = fut.result()
                print(futures[fut], data["variants"][futures[fut]], flush=True)
                write_json(args.out, data)
    for v in variants:  # one at a time: each engine's latency on an otherwise idle GPU
        row = data["variants"].get(v, {})
        if "engine" in row and args.phase != "build":
            row.update(measure(Path(row["engine"]), row["inputs"], [1, 16], args.iterations))
            print(v, json.dumps(row["batches"]), flush=True)
            write_json(args.out, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
