"""``edgert build``: ONNX in, TensorRT (or TensorRT-RTX) engine + sidecar JSON out, reusing cached engines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    from edgert.backends import engine_builders

    p = subparsers.add_parser(
        "build", help="build a TensorRT engine from an ONNX model (cached: rebuilt only when something changed)",
        description="Build MODEL.onnx into an engine with a sidecar OUT.engine.json. A second call with the same "
                    "model, settings, TensorRT and GPU reuses the engine; a changed one is rebuilt.")
    p.add_argument("model", help="the ONNX model")
    p.add_argument("-o", "--output", help="engine path (default: MODEL.engine beside the model)")
    p.add_argument("--backend", choices=("auto", *engine_builders()), default="auto",
                   help="tensorrt (Jetson, dGPU) or tensorrt-rtx (RTX GPUs; also builds on CPU-only machines); "
                        "auto: tensorrt where it is installed, else tensorrt-rtx")
    p.add_argument("--precision", choices=("fp32", "fp16", "int8", "best"), default="fp32",
                   help="int8 needs a Q/DQ model (edgert calibrate) or --calib-cache")
    p.add_argument("--shapes", action="append", default=[], metavar="NAME:MIN/OPT/MAX",
                   help="optimization profile of a dynamic input, e.g. images:1x3x320x320/1x3x640x640/1x3x1280x1280 "
                        "(NAME:DIMS for one fixed shape); repeat or comma-join for several inputs")
    p.add_argument("--batch", type=int, metavar="N",
                   help="engine for up to N frames a call (edgert run with several sources, bench --batch): a batch-1 "
                        "model is made dynamic first (checked, cached), the profile runs 1..N, tuned for N; the "
                        "engine goes where edgert run looks for it")
    p.add_argument("--contexts", type=int, metavar="N",
                   help="execution contexts that may run a dynamic-shape engine at once (GPU slots): TensorRT 8.x "
                        "gives each its own optimization profile, so the profile is built N times (default 4 with "
                        "--batch, the GPU processor's most slots; else 1)")
    p.add_argument("--detailed-layers", action="store_true",
                   help="keep each layer's precision and tactic in the engine (TensorRT's DETAILED profiling "
                        "verbosity), for the layer report of bench --layers")
    p.add_argument("--workspace", type=int, metavar="MIB", help="memory pool limit for tactics, in MiB")
    p.add_argument("--opt-level", type=int, choices=range(6), metavar="0-5",
                   help="builder optimization level (TensorRT 8.6+; higher: slower build, maybe faster engine)")
    p.add_argument("--dla-core", type=int, metavar="N", help="build for Jetson DLA core N (with GPU fallback)")
    p.add_argument("--no-gpu-fallback", action="store_true", help="with --dla-core: fail on layers DLA cannot run")
    p.add_argument("--calib-cache", metavar="PATH", help="TensorRT INT8 calibration cache (implicit INT8)")
    p.add_argument("--strongly-typed", action="store_true",
                   help="strongly typed network (always on where TensorRT requires it: TensorRT-RTX, TensorRT 11)")
    p.add_argument("--no-timing-cache", action="store_true", help="do not read or write the persistent timing cache")
    p.add_argument("--force", action="store_true", help="rebuild even when the cached engine matches")
    # --progress / --no-progress by hand: argparse.BooleanOptionalAction needs Python 3.9 (JetPack 5 has 3.8).
    progress = p.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="progress on stderr: a bar on a terminal, elsewhere a line per tenth of the build "
                               "(default: on a terminal only)")
    progress.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                          help="no progress indicator")
    p.add_argument("--json", action="store_true", help="print the result and sidecar as JSON")
    p.set_defaults(func=run)


def pick_build_backend(name: str) -> str:
    """``auto``: the first engine-building backend that can build here: its builder installed and a GPU
    present, unless it builds without one (TensorRT where it can, else TensorRT-RTX where installed)."""
    from edgert._lazy import is_importable
    from edgert.backends import backend_class, engine_builders
    from edgert.errors import BackendUnavailable
    from edgert.platform import gpu_present

    if name != "auto":
        return name
    for candidate in engine_builders():
        cls = backend_class(candidate)
        if is_importable(cls.build_module) and (cls.builds_without_gpu or gpu_present()[0]):
            return candidate
    raise BackendUnavailable("no TensorRT builder here: install TensorRT (JetPack: apt install python3-libnvinfer) "
                             "or pip install 'edgert[rtx]' for TensorRT-RTX")


def max_gpu_slots() -> int:
    """The GPU processor's most slots by default: an engine for several sources gets a profile for each."""
    from edgert.pipeline.processor import MANY_SOURCES_BATCH, default_slots

    return default_slots("gpu", MANY_SOURCES_BATCH)


def batch_profiles(model: Path, batch: int) -> tuple[Path, list[str]]:
    """The model to build for ``batch`` frames a call (made dynamic where fixed at 1, as ``edgert run`` does) and
    its profile: every dynamic-batch input from 1 to ``batch``, tuned for ``batch``."""
    from edgert.cli.bench import batch_inputs
    from edgert.errors import ConfigError
    from edgert.pipeline.choice import batched_model

    if batch < 1 or batch > 64:
        raise ConfigError(f"--batch: expected 1..64, got {batch}")
    path, got, note = batched_model(str(model), batch)
    if got != batch:
        raise ConfigError(f"--batch {batch}: {note}")
    rest = batch_inputs(Path(path), [])

    def dims(n: int, r: tuple[int, ...]) -> str:
        return "x".join(str(d) for d in (n, *r))

    return Path(path), [f"{name}:{dims(1, r)}/{dims(batch, r)}/{dims(batch, r)}" for name, r in rest.items()]


def run(args: argparse.Namespace) -> int:
    from edgert.builder import parse_shapes
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.errors import ConfigError

    model, shapes = Path(args.model), list(args.shapes)
    if args.contexts is not None and args.batch is None and not shapes:
        raise ConfigError("--contexts: copies an optimization profile, and this build has none. Note: add --batch N "
                          "or --shapes")
    if args.batch is not None:
        if shapes:
            raise ConfigError("--batch and --shapes: give one (--batch makes the batch profile itself)")
        if args.output:
            raise ConfigError("--batch and -o: the engine goes beside the dynamic-batch model, where edgert run "
                              "looks for it")
        model, shapes = batch_profiles(model, args.batch)
    options = BuildOptions(
        backend=pick_build_backend(args.backend),
        precision=args.precision,
        profiles=tuple(parse_shapes(shapes)),
        detailed_layers=args.detailed_layers,
        contexts=args.contexts or (max_gpu_slots() if args.batch is not None else 1),
        workspace_mib=args.workspace,
        optimization_level=args.opt_level,
        dla_core=args.dla_core,
        gpu_fallback=not args.no_gpu_fallback,
        calib_cache=Path(args.calib_cache) if args.calib_cache else None,
        strongly_typed=True if args.strongly_typed else None,
        timing_cache=not args.no_timing_cache,
        progress=args.progress,
    )
    result = build_engine(model, args.output, options, force=args.force)
    if args.json:
        print(json.dumps({"status": result.status, "reason": result.reason, "engine": str(result.engine),
                          "sidecar": str(result.sidecar), "record": result.record.to_json()}, indent=2))
    else:
        print(result.summary())
    return 0
