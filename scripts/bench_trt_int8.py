"""INT8 measured as engine speed on a real TensorRT: per detector, FP32 / FP16 / edgert's default INT8 /
edgert --full-int8 / NVIDIA ModelOpt's INT8 (and implicit INT8 from a calibration cache where one is given),
each built once with a batch profile 1..32 tuned for 16 and DETAILED layer information, then:

- engine latency (p50/p99 of one call) and throughput (frames/s) at batch 1, 16 and 32 (``edgert bench``'s loop);
- the layer report: compute layers by precision, float layers, reformat layers (TensorRT's engine inspector);
- agreement with the FP32 engine on held-out images: mAP@0.5:0.95 with the FP32 engine's detections as the
  ground truth (``edgert compare``'s measure, both through the runtime's preprocessing and decoding).

Variants come from a folder of quantized models named ``{model}-edgert.onnx``, ``{model}-edgert-full.onnx``,
``{model}-modelopt.onnx`` (and ``{model}-edgert.calib`` for implicit INT8); a missing one is left out and said.
Runs where TensorRT and a GPU are (the device machine: scripts/gpu_trt85.sh int8); on a machine without them
it exits 1 with one line. Writes JSON (``--out``) and prints one table.

    python scripts/bench_trt_int8.py --int8 DIR --heldout LIST.txt --out docs/results/trt85-int8.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from _bench import assets_dir, machine_info, write_json

MODELS = {"nanodet": "nanodet-m-416-coco-v8layout.onnx", "yolov8s": "yolov8s-fall-640.onnx",
          "yolov3tiny": "yolov3-tiny-coco-416.onnx"}
#: variant -> (source file name pattern, precision); "{fp32}" is the shared FP32 model
VARIANTS = {"fp32": ("{fp32}", "fp32"), "fp16": ("{fp32}", "fp16"), "int8-edgert": ("{name}-edgert.onnx", "int8"),
            "int8-edgert-full": ("{name}-edgert-full.onnx", "int8"), "int8-modelopt": ("{name}-modelopt.onnx", "int8"),
            "int8-implicit": ("{fp32}", "int8")}


def _source(name: str, variant: str, int8_dir: Path) -> tuple[Path | None, Path | None]:
    pattern, _ = VARIANTS[variant]
    fp32 = assets_dir() / "models" / "detection" / MODELS[name]
    if pattern == "{fp32}":
        if variant == "int8-implicit":
            cache = int8_dir / f"{name}-edgert.calib"
            return (fp32, cache) if cache.is_file() else (None, None)
        return fp32, None
    path = int8_dir / pattern.format(name=name)
    return (path, None) if path.is_file() else (None, None)


def build(name: str, variant: str, int8_dir: Path, engines: Path, max_batch: int, opt_batch: int) -> dict[str, Any]:
    from edgert.builder import parse_shapes
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.cli.bench import batch_inputs
    from edgert.rewrite.batch import batched_model_path

    src, cache = _source(name, variant, int8_dir)
    if src is None:
        return {"skipped": "no quantized model for this variant"}
    batched = batched_model_path(src)
    rest = batch_inputs(batched, [])

    def dims(n: int, r: tuple[int, ...]) -> str:
        return "x".join(str(d) for d in (n, *r))

    shapes = [f"{k}:{dims(1, r)}/{dims(opt_batch, r)}/{dims(max_batch, r)}" for k, r in rest.items()]
    out = engines / f"{name}.{variant}.engine"
    options = BuildOptions(backend="tensorrt", precision=VARIANTS[variant][1], profiles=tuple(parse_shapes(shapes)),
                           calib_cache=cache, detailed_layers=True)
    t0 = time.perf_counter()
    result = build_engine(batched, out, options)
    return {"source": str(src), "engine": str(result.engine), "status": result.status,
            "build_s": round(time.perf_counter() - t0, 1), "engine_mb": round(result.record.engine_bytes / 1e6, 2),
            "inputs": {k: list(r) for k, r in rest.items()}}


def measure(engine: Path, inputs: dict[str, list[int]], batches: list[int], iterations: int) -> dict[str, Any]:
    from edgert.backends import SessionOptions, get_backend
    from edgert.cli.bench import bench_session
    from edgert.engine.layers import summarize_layers

    be = get_backend("tensorrt")
    rows = []
    layers: dict[str, Any] = {}
    for b in batches:
        options = SessionOptions(shapes={k: (b, *r) for k, r in inputs.items()})
        with be.open(engine, options) as session:
            if not layers:
                layers = summarize_layers(session.layer_information()).to_json()
            res = bench_session(session, iterations, 20)
        lat = res["latency_ms"]
        rows.append({"batch": b, "p50_ms": round(lat["p50"], 3), "p99_ms": round(lat["p99"], 3),
                     "frames_per_s": round(b * res["throughput_fps"], 1),
                     "compute_p50_ms": (res.get("gpu") or {}).get("compute_ms", {}).get("p50"),
                     "compute_only_frames_per_s": round(b * (res.get("gpu") or {}).get("compute_only_fps", 0.0), 1)})
    return {"batches": rows, "layers": layers}


def agreement(reference: Path, candidate: Path, heldout: list[Path]) -> dict[str, Any]:
    from edgert.calib.comparison import compare_detectors
    from edgert.vision.image_io import read_image

    frames = [(p.name, read_image(p)) for p in heldout]
    r = compare_detectors(reference, candidate, frames, backend="tensorrt")
    return {"frames": r["frames"], "map50_95": r["map"]["map50_95"], "map50": r["map"]["map50"],
            "strict_map50_95": r["map_strict"]["map50_95"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--int8", type=Path, required=True, help="folder of quantized models ({model}-edgert.onnx, ...)")
    ap.add_argument("--heldout", type=Path, help="text file: held-out image names (in the assets' images/)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batches", default="1,16,32")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--engines", type=Path, default=Path("/tmp/edgert-trt-int8"))
    ap.add_argument("--phase", choices=("build", "measure", "all"), default="all",
                    help="build: engines only (cached for the next phase); measure: latency, layers, agreement")
    ap.add_argument("--out", type=Path, default=Path("trt-int8.json"))
    args = ap.parse_args()
    from edgert.backends import backend_class

    probe = backend_class("tensorrt")().probe()
    if not probe.available:
        print(f"bench_trt_int8: TensorRT cannot run here: {probe.reason}", file=sys.stderr)
        return 1
    batches = [int(b) for b in args.batches.split(",")]
    args.engines.mkdir(parents=True, exist_ok=True)
    heldout = [assets_dir() / "images" / n.strip() for n in args.heldout.read_text().splitlines() if n.strip()] \
        if args.heldout else []
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    data: dict[str, Any] = {"machine": machine_info(), "trt": probe.reason, "batches": batches,
                            "profile": f"1..{max(batches)}, tuned for 16", "heldout_images": len(heldout),
                            "models": previous.get("models", {})}
    for name in args.models.split(","):
        rows = data["models"].setdefault(name, {})
        for variant in args.variants.split(","):
            row = rows.setdefault(variant, {})
            try:
                if args.phase in ("build", "all"):
                    row["build"] = build(name, variant, args.int8, args.engines, max(batches), 16)
                    print(f"{name} {variant}: {row['build']}", flush=True)
                built = row.get("build", {})
                if args.phase in ("measure", "all") and built.get("engine"):
                    row.update(measure(Path(built["engine"]), built["inputs"], batches, args.iterations))
                    ref = rows.get("fp32", {}).get("build", {}).get("engine")
                    if heldout and ref and variant != "fp32":
                        row["agreement"] = agreement(Path(ref), Path(built["engine"]), heldout)
            except Exception as exc:  # one variant's failure is a row, not the end of the run
                row["error"] = f"{type(exc).__name__}: {exc}"
                row["traceback"] = traceback.format_exc()[-3000:]
                print(f"{name} {variant}: FAILED {row['error']}", flush=True)
            write_json(args.out, data)
    _table(data)
    write_json(args.out, data)
    return 0


def _table(data: dict[str, Any]) -> None:
    print(f"{'model':<11}{'variant':<18}{'b1 p50':>8}{'b1 p99':>8}{'b16 f/s':>10}{'b32 f/s':>10}"
          f"{'int8':>6}{'fp16':>6}{'fp32':>6}{'refmt':>6}{'mAP':>7}")
    for name, rows in data["models"].items():
        fp16 = {r["batch"]: r for r in rows.get("fp16", {}).get("batches", [])}
        for variant, row in rows.items():
            if "batches" not in row:
                print(f"{name:<11}{variant:<18}{row.get('error') or row.get('build', {}).get('skipped', '')}")
                continue
            by = {r["batch"]: r for r in row["batches"]}
            lay = row.get("layers", {}).get("by_precision", {})
            agree = row.get("agreement", {}).get("map50_95")
            speed = ""
            if 16 in by and 16 in fp16 and variant.startswith("int8"):
                speed = f"  {by[16]['frames_per_s'] / fp16[16]['frames_per_s']:.2f}x fp16 at b16"
            print(f"{name:<11}{variant:<18}{by.get(1, {}).get('p50_ms', 0):>8.2f}{by.get(1, {}).get('p99_ms', 0):>8.2f}"
                  f"{by.get(16, {}).get('frames_per_s', 0):>10.0f}{by.get(32, {}).get('frames_per_s', 0):>10.0f}"
                  f"{lay.get('int8', 0):>6}{lay.get('fp16', 0):>6}{lay.get('fp32', 0):>6}"
                  f"{row.get('layers', {}).get('reformats', 0):>6}{'' if agree is None else f'{agree:.3f}':>7}{speed}")


if __name__ == "__main__":
    sys.exit(main())
