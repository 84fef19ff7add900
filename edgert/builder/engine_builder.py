"""ONNX in, TensorRT engine out, with a sidecar and a cache: the code behind ``edgert build``.

Written against the API TensorRT 8.5 to 10.x and TensorRT-RTX share, detecting features rather than
checking version numbers: the explicit-batch flag only where it exists (gone in 10), strongly typed
networks where the weak-typing precision flags are gone (TensorRT-RTX, TensorRT 11), node names in
parser errors from ``ParserError.node_name()`` where it exists, else from the ONNX graph.

Objects are annotated with the ``tensorrt`` stub types (``tensorrt-stubs``), so mypy checks every call
on them; the module itself is imported lazily and may be ``tensorrt_rtx``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from edgert.builder.onnx_info import OnnxInfo, ShapeProfile, check_profiles, file_sha256, inspect_onnx
from edgert.builder.progress import BuildProgress
from edgert.builder.target import CPU_BUILD, TargetInfo, import_tensorrt, target_info
from edgert.builder.timing_cache import TimingCache, default_cache_dir, timing_cache_path
from edgert.engine.file import write_atomic
from edgert.engine.sidecar import EngineRecord, cached_engine_matches, now_iso, read_sidecar, write_sidecar
from edgert.engine.trt_logger import make_logger
from edgert.errors import BuildError, ConfigError

if TYPE_CHECKING:
    import tensorrt

__all__ = ["PRECISIONS", "BuildOptions", "BuildResult", "ParserFailed", "build_engine", "folds_constants", "fp16_route",
           "parser_error_line", "qdq_scale_refusal"]

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8", "best")


@dataclass(frozen=True)
class BuildOptions:
    backend: str = "tensorrt"  # or "tensorrt-rtx"
    precision: str = "fp32"  # fp32 | fp16 | int8 | best
    profiles: tuple[ShapeProfile, ...] = ()
    workspace_mib: int | None = None  # memory pool limit for tactics; None: TensorRT's default (all)
    optimization_level: int | None = None  # 0..5, TensorRT >= 8.6; None: TensorRT's default (3)
    dla_core: int | None = None  # Jetson DLA core; layers DLA cannot run fall back to the GPU
    gpu_fallback: bool = True
    calib_cache: Path | None = None  # implicit INT8: a TensorRT calibration cache (edgert calibrate)
    strongly_typed: bool | None = None  # None: where this TensorRT requires it
    timing_cache: bool = True
    cache_dir: Path | None = None
    progress: bool | None = None  # None: when stderr is a terminal
    detailed_layers: bool = False  # keep each layer's precision and tactic in the engine (the layer report)
    contexts: int = 1  # copies of the profiles: TensorRT 8.x gives each execution context (GPU slot) its own

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} is not known. Note: valid are {', '.join(PRECISIONS)}")
        if self.workspace_mib is not None and self.workspace_mib <= 0:
            raise ConfigError("workspace must be a positive number of MiB")
        if self.optimization_level is not None and not 0 <= self.optimization_level <= 5:
            raise ConfigError("optimization level must be 0..5")
        if self.dla_core is not None and self.dla_core < 0:
            raise ConfigError("DLA core must be 0 or more")
        if not 1 <= self.contexts <= 16:
            raise ConfigError(f"contexts: expected 1..16, got {self.contexts}")


@dataclass(frozen=True)
class BuildResult:
    engine: Path
    sidecar: Path
    status: str  # "built", "rebuilt" or "reused"
    reason: str  # why it was (re)built or reused
    record: EngineRecord
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        r = self.record
        what = {"reused": "reused cached engine", "built": "built", "rebuilt": "rebuilt"}[self.status]
        took = "" if self.status == "reused" else f" in {r.build_seconds:.1f} s"
        why = f" ({self.reason})" if self.status == "rebuilt" else ""
        return (f"{what} {self.engine} [{r.backend} {r.trt_version}, {r.precision}, "
                f"{r.engine_bytes / 1e6:.1f} MB]{took}{why}")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def parser_error_line(parser: tensorrt.OnnxParser, info: OnnxInfo, logged: list[str]) -> str:
    """TensorRT's ONNX parser errors as one line: node name, op type, reason, and how many more."""
    n = parser.num_errors
    if n == 0:
        reason = _one_line(logged[-1]) if logged else "no reason given"
        return f"{info.path.name}: TensorRT's ONNX parser failed: {reason}"
    lines = []
    for i in range(n):
        err = parser.get_error(i)
        index = int(err.node())
        name, op = info.node_label(index)
        # node_name()/node_operator() exist from TensorRT 10 on; 8.x gives the index alone.
        if hasattr(err, "node_name") and err.node_name():
            name = err.node_name()
        if hasattr(err, "node_operator") and err.node_operator():
            op = err.node_operator()
        reason = f"{_one_line(err.desc())} [{str(err.code()).split('.')[-1]}]"
        lines.append(reason if index < 0 else f"node {name!r} ({op}): {reason}")
    for extra in lines[1:]:
        log.info("parser error: %s", extra)
    more = f" (+{n - 1} more; -v lists them)" if n > 1 else ""
    return f"{info.path.name}: TensorRT's ONNX parser failed at {lines[0]}{more}"


def _network_flags(trt: ModuleType, strongly_typed: bool) -> int:
    ndf = trt.NetworkDefinitionCreationFlag
    flags = 0
    explicit = getattr(ndf, "EXPLICIT_BATCH", None)
    if explicit is not None and _major(trt) < 10:  # implicit batch is gone in 10; the flag is a no-op there
        flags |= 1 << int(explicit)
    if strongly_typed:
        strong = getattr(ndf, "STRONGLY_TYPED", None)
        if strong is None:
            raise BuildError(f"TensorRT {trt.__version__} has no strongly typed networks (9.1 or newer has)")
        flags |= 1 << int(strong)
    return flags


def _major(trt: ModuleType) -> int:
    return _major_of(str(trt.__version__))


def _major_of(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0


def _needs_strong_typing(trt: ModuleType) -> bool:
    # TensorRT-RTX (and TensorRT 11) dropped the FP16/INT8 builder flags: precision comes from the network.
    return not hasattr(trt.BuilderFlag, "FP16")


def _calibrator(trt: ModuleType, data: bytes) -> Any:
    """An INT8 calibrator that only replays a calibration cache (implicit INT8 from edgert calibrate)."""

    class CacheCalibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: list[str]) -> None:
            return None  # every scale comes from the cache

        def read_calibration_cache(self) -> bytes:
            return data

        def write_calibration_cache(self, cache: Any) -> None:
            return None

    return CacheCalibrator()


def _check_precision(info: OnnxInfo, options: BuildOptions, strong: bool) -> None:
    """Refuse precision requests this build cannot honour, before any cached engine is touched."""
    precision = options.precision
    if strong:
        if precision == "int8" and not info.has_qdq:
            raise BuildError(
                f"{options.backend} builds strongly typed networks and cannot use a calibration cache: "
                "quantize the model to Q/DQ first (edgert calibrate)")
    elif precision == "int8" and not info.has_qdq and options.calib_cache is None:
        raise BuildError(
            f"{info.path.name}: INT8 needs a Q/DQ model or a calibration cache. Note: run edgert calibrate, "
            "then pass the Q/DQ model or --calib-cache")


def qdq_scale_refusal(info: OnnxInfo, backend: str, trt_version: str) -> str | None:
    """Why TensorRT ``trt_version`` cannot parse this Q/DQ model, or None. TensorRT 8.5's parser refused each of
    ModelOpt's default INT8 detectors on their first weight QuantizeLinear ("Scale coefficients must all be
    positive") though every scale was positive: they were FP16, as ModelOpt writes them by default for
    TensorRT 10."""
    if backend != "tensorrt" or _major_of(trt_version) >= 10 or "float16" not in info.qdq_scale_types:
        return None
    return (f"{info.path.name}: its Q/DQ scales are FP16, which TensorRT {trt_version}'s ONNX parser cannot read "
            "(TensorRT 10 can). Note: quantize it with FP32 around the Q/DQ (edgert calibrate; ModelOpt: "
            "--high_precision_dtype fp32)")


def _set_precision(trt: ModuleType, builder: tensorrt.Builder, config: tensorrt.IBuilderConfig, info: OnnxInfo,
                   options: BuildOptions, strong: bool) -> None:
    precision = options.precision
    if strong:
        return  # a strongly typed network runs each tensor in the type the ONNX gives it
    bf = trt.BuilderFlag
    want_fp16 = float_layers_fp16(options, strong)
    want_int8 = precision == "int8" or (precision == "best" and (info.has_qdq or options.calib_cache is not None))
    if want_fp16:
        if not builder.platform_has_fast_fp16:
            log.warning("this GPU has no fast FP16; the engine may not be faster than FP32")
        config.set_flag(bf.FP16)
    if want_int8:
        config.set_flag(bf.INT8)
        if not info.has_qdq and options.calib_cache is not None:
            config.int8_calibrator = _calibrator(trt, options.calib_cache.read_bytes())


def float_layers_fp16(options: BuildOptions, strong: bool) -> bool:
    """Whether the builder may run float layers in FP16. An INT8 engine's float layers (those its Q/DQ model
    keeps float, its decode head, the reformats around them) run in FP16 as well, as ``trtexec --int8 --fp16``
    (``--best``) and ModelOpt's and Ultralytics' INT8 builds do: INT8 alone leaves them in FP32, and an INT8
    engine can then be slower than the FP16 one. A strongly typed network takes the types its ONNX gives."""
    return not strong and options.precision in ("fp16", "best", "int8")


def without_library_tactics(trt: ModuleType) -> bool:
    """Whether this TensorRT's builder must be kept off cuBLAS/cuDNN tactics: TensorRT 8.x and 9.x try them by
    default and load the libraries for it, which a Jetson image without cuDNN (or with stubs in their place)
    cannot serve: the build then fails or crashes inside the library. TensorRT 10 turned them off by default,
    having its own kernels for every layer an ONNX detector has, so 8.x built this way makes the engines 10 makes."""
    return hasattr(trt, "TacticSource") and hasattr(trt.TacticSource, "CUDNN") and _major(trt) < 10


def _tactic_sources(trt: ModuleType, config: tensorrt.IBuilderConfig) -> None:
    sources = int(config.get_tactic_sources())
    for name in ("CUBLAS", "CUBLAS_LT", "CUDNN"):
        member = getattr(trt.TacticSource, name, None)
        if member is not None:
            sources &= ~(1 << int(member))
    if not config.set_tactic_sources(sources):
        raise BuildError(f"TensorRT {trt.__version__} refused the tactic sources without cuBLAS/cuDNN")


def _configure(trt: ModuleType, builder: tensorrt.Builder, config: tensorrt.IBuilderConfig,
               options: BuildOptions, profiles: list[ShapeProfile]) -> None:
    if options.backend == "tensorrt" and without_library_tactics(trt):
        _tactic_sources(trt, config)
    if options.detailed_layers:
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if options.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    if options.optimization_level is not None:
        if hasattr(config, "builder_optimization_level"):
            config.builder_optimization_level = options.optimization_level
        else:
            log.warning("TensorRT %s has no builder optimization level (8.6+); ignored", trt.__version__)
    for _ in range(options.contexts if profiles else 0):
        profile: tensorrt.IOptimizationProfile = builder.create_optimization_profile()
        for p in profiles:
            profile.set_shape(p.name, trt.Dims(list(p.min)), trt.Dims(list(p.opt)), trt.Dims(list(p.max)))
        if config.add_optimization_profile(profile) < 0:
            raise BuildError("TensorRT refused the optimization profile given by --shapes")
    if options.dla_core is not None:
        if builder.num_DLA_cores == 0:
            raise BuildError("this machine has no DLA core (Jetson AGX Orin, Orin NX and Xavier have them)")
        if options.dla_core >= builder.num_DLA_cores:
            raise BuildError(f"DLA core {options.dla_core} does not exist; this machine has {builder.num_DLA_cores}")
        if options.precision == "fp32":
            raise BuildError("DLA runs FP16 or INT8 only: add --precision fp16 (or int8)")
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = options.dla_core
        if options.gpu_fallback:
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)


def _build_plan(trt: ModuleType, info: OnnxInfo, options: BuildOptions, profiles: list[ShapeProfile],
                target: TargetInfo, strong: bool) -> bytes:
    logger = make_logger(trt)
    # TensorRT's errors are kept, not printed: a failure is reported once, as one BuildError line. (A CPU-only
    # TensorRT-RTX build logs harmless CUDA "driver insufficient" errors that would otherwise alarm.)
    with logger.capturing() as logged:
        try:
            builder: tensorrt.Builder = trt.Builder(logger)
        except (RuntimeError, TypeError) as exc:
            raise BuildError(f"{options.backend} could not start its builder: {_one_line(str(exc))} "
                             f"{_one_line(logger.last_error())}".strip()) from exc
        if builder is None:
            raise BuildError(f"{options.backend} could not start its builder: {_one_line(logger.last_error())}")
        network: tensorrt.INetworkDefinition = builder.create_network(_network_flags(trt, strong))
        parser: tensorrt.OnnxParser = trt.OnnxParser(network, logger)
        # parse_from_file, not parse(bytes): it finds external weight files beside the model.
        if not parser.parse_from_file(str(info.path)):
            raise ParserFailed(parser_error_line(parser, info, logged))
        config: tensorrt.IBuilderConfig = builder.create_builder_config()
        _set_precision(trt, builder, config, info, options, strong)
        _configure(trt, builder, config, options, profiles)
        timing: TimingCache | None = None
        if options.timing_cache:
            timing = TimingCache(timing_cache_path(target, options.cache_dir))
            timing.attach(config)
        with BuildProgress(info.path.name, options.progress) as progress:
            monitor = progress.monitor(trt)
            if monitor is not None and hasattr(config, "progress_monitor"):
                config.progress_monitor = monitor
            else:
                progress.follow_log(trt, logger)
            try:
                plan = builder.build_serialized_network(network, config)
            except (RuntimeError, TypeError) as exc:
                logged.append(str(exc))
                plan = None
        if plan is None:
            reason = _one_line(logged[-1]) if logged else "no reason given"
            raise BuildError(
                f"{info.path.name}: {options.backend} could not build an engine: {reason}. "
                "Note: run this model on another backend (--backend onnxruntime or onnxruntime-cuda)")
        if timing is not None:
            timing.save(config)
    return bytes(memoryview(plan))


class ParserFailed(BuildError):
    """TensorRT's ONNX parser refused the model (the builder never ran)."""


def _folded_onnx(info: OnnxInfo, options: BuildOptions) -> OnnxInfo | None:
    """The model with its constant subgraphs folded, for a parser that refuses a shape computed at run time from
    constants: NanoDet's TensorFlow-converted graph builds a Reshape's shape with ScatterND, which TensorRT 8.5's
    parser rejects ("an IScatterLayer cannot be used to compute a shape tensor"). The same folding as before a
    TensorRT 8.x Q/DQ build (:func:`_constants_folded`); a copy even where nothing folds, and None only where it
    cannot be written (the parser's own line is then the answer)."""
    folded = _constants_folded(info, options, always=True)
    return folded if folded is not info else None


def folds_constants(backend: str, trt_version: str, info: OnnxInfo) -> bool:
    """Whether the build folds the model's constant nodes first (:mod:`edgert.rewrite.fold`): a Q/DQ model on
    TensorRT 8.x, whose Q/DQ graph optimizer does not finish on a pointwise node of constants alone."""
    return backend == "tensorrt" and info.has_qdq and _major_of(trt_version) < 10


def _constants_folded(info: OnnxInfo, options: BuildOptions, always: bool = False) -> OnnxInfo:
    """``info``'s model with its constant nodes folded by onnx's reference evaluator (:mod:`edgert.rewrite.fold`:
    Q/DQ pairs kept), cached beside the engines by the model's sha256; ``info`` itself where the folded copy
    cannot be written, or (unless ``always``) where there is nothing to fold."""
    import onnx

    from edgert.onnx_file import read_onnx
    from edgert.rewrite.fold import fold_constants

    folder = (options.cache_dir or default_cache_dir()) / "folded"
    out = folder / f"{info.path.stem}.{info.sha256[:16]}.onnx{onnx.__version__}.folded.onnx"
    if not out.is_file():
        model = read_onnx(info.path)
        count = fold_constants(model)
        if not count and not always:
            return info
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            onnx.save(model, str(tmp))
            tmp.replace(out)
        except (OSError, ValueError) as exc:  # a read-only cache, a model over protobuf's 2 GB
            log.warning("%s: building it unfolded (%s)", info.path.name, exc)
            return info
        log.info("%s: %d constant nodes folded (%s)", info.path.name, count, out)
    return inspect_onnx(out)


def fp16_route(options: BuildOptions, strong: bool) -> str | None:
    """How an FP16 engine gets its FP16: ``"builder-flag"`` (TensorRT < 11's BuilderFlag.FP16) or
    ``"onnx-fp16"`` (strongly typed builders: the ONNX is converted, :mod:`edgert.rewrite.fp16`)."""
    if options.precision not in ("fp16", "best"):
        return None
    if not strong:
        return "builder-flag"
    return "onnx-fp16" if options.precision == "fp16" else None  # best on a strong builder: the ONNX's types


def _fp16_onnx(info: OnnxInfo, options: BuildOptions) -> OnnxInfo:
    """The FP16 ONNX a strongly typed builder builds: converted into the engine cache folder, reused while
    the source model and the converter are the same. A model that already computes in FP16 is built as is."""
    from edgert.onnx_file import read_onnx
    from edgert.rewrite.fp16 import convert_file, converter_version, fp16_state

    state = fp16_state(read_onnx(info.path, weights=False))
    if state == "float16":
        log.info("%s already computes in FP16: built as it is", info.path.name)
        return info
    if state == "qdq":
        raise BuildError(f"{info.path.name}: an INT8 Q/DQ model cannot be built at FP16 on a strongly typed "
                         f"builder. Note: use --precision int8, or build the FP32 model with --precision fp16")
    version = converter_version()
    folder = (options.cache_dir or default_cache_dir()) / "fp16"
    out = folder / f"{info.path.stem}.{info.sha256[:16]}.occ{version}.fp16.onnx"
    if out.is_file():
        log.info("reusing the FP16 conversion %s", out)
    else:
        summary = convert_file(info.path, out)
        log.info("converted %s to FP16 (%s nodes FP16, %s float32): %s", info.path.name, summary["fp16_nodes"],
                 summary["float32_nodes"], out)
    return inspect_onnx(out)


def _builder_flags(options: BuildOptions, strong: bool, info: OnnxInfo, trt: ModuleType) -> dict[str, Any]:
    return {
        "library_tactics": not (options.backend == "tensorrt" and without_library_tactics(trt)),
        "detailed_layers": options.detailed_layers,
        "contexts": options.contexts,
        "fp16_route": fp16_route(options, strong),
        "fp16_flag": float_layers_fp16(options, strong),
        "workspace_mib": options.workspace_mib,
        "optimization_level": options.optimization_level,
        "dla_core": options.dla_core,
        "gpu_fallback": options.gpu_fallback if options.dla_core is not None else None,
        "strongly_typed": strong,
        "explicit_quantization": info.has_qdq,
    }


def build_engine(onnx_path: str | Path, out: str | Path | None = None, options: BuildOptions | None = None,
                 force: bool = False) -> BuildResult:
    """Build ``onnx_path`` into ``out`` (default: beside it, ``.engine``), or reuse a matching cached engine."""
    options = options or BuildOptions()
    info = inspect_onnx(onnx_path)
    engine = Path(out) if out is not None else info.path.with_suffix(".engine")  # beside the source model
    profiles = check_profiles(info, list(options.profiles))
    if options.calib_cache is not None and not options.calib_cache.is_file():
        raise ConfigError(f"{options.calib_cache}: calibration cache not found")
    trt = import_tensorrt(options.backend)
    target = target_info(options.backend, trt)
    if options.backend == "tensorrt" and target.gpu.name == CPU_BUILD:
        raise BuildError("TensorRT needs an NVIDIA GPU to build engines. Note: --backend tensorrt-rtx builds "
                         "on a CPU-only machine (to check a model); run engines where TensorRT runs")
    strong = options.strongly_typed if options.strongly_typed is not None else _needs_strong_typing(trt)
    _check_precision(info, options, strong)
    refusal = qdq_scale_refusal(info, options.backend, str(trt.__version__))
    if refusal:
        raise BuildError(refusal)
    convert = fp16_route(options, strong) == "onnx-fp16"
    flags = _builder_flags(options, strong, info, trt)
    fold = folds_constants(options.backend, target.trt_version, info)
    if fold:  # only where it applies, so the engines built before it stay valid
        flags["constants_folded"] = True
    if convert:  # a new converter may convert differently: part of the key
        from edgert.rewrite.fp16 import converter_version

        flags["fp16_converter"] = f"onnxconverter-common {converter_version()}"
    want = EngineRecord(
        onnx_sha256=info.sha256,
        backend=options.backend,
        trt_version=target.trt_version,
        precision=options.precision,
        calibration_cache_sha256=file_sha256(options.calib_cache) if options.calib_cache else None,
        profiles=[p.to_json() for p in profiles],
        builder_flags=flags,
        gpu=target.gpu,
        onnx_path=str(info.path),
    )
    existed = engine.exists()
    if not force:
        reusable, why = cached_engine_matches(engine, want)
        if reusable:
            record = read_sidecar(engine)
            if record is not None:
                log.info("reusing %s: sidecar matches (%s)", engine, why)
                return BuildResult(engine, engine.with_name(engine.name + ".json"), "reused", why, record)
        reason = why
    else:
        reason = "--force"
    if existed:
        log.log(logging.INFO if force else logging.WARNING, "rebuilding %s: %s", engine, reason)
    log.info("building %s with %s %s (%s)", info.path.name, options.backend, target.trt_version, options.precision)
    t0 = time.perf_counter()
    parsed = _fp16_onnx(info, options) if convert else info
    if fold:
        parsed = _constants_folded(parsed, options)
    try:
        plan = _build_plan(trt, parsed, options, profiles, target, strong)
    except ParserFailed as exc:
        if fold:  # folded already: a second pass would parse the same graph
            raise
        try:
            folded = _folded_onnx(parsed, options)
        except Exception as fold_error:  # onnx cannot read it either: the parser's line is the answer
            log.info("constant folding failed: %s", fold_error)
            folded = None
        if folded is None:
            raise
        log.warning("%s; retrying with its constants folded (%s)", exc, folded.path)
        try:
            plan = _build_plan(trt, folded, options, profiles, target, strong)
        except ParserFailed:
            raise exc from None
        parsed = folded
    seconds = time.perf_counter() - t0
    write_atomic(engine, plan)
    from edgert._version import __version__

    record = EngineRecord(
        **{**want.__dict__,
           "engine_sha256": file_sha256(engine),
           "engine_bytes": len(plan),
           "build_seconds": round(seconds, 3),
           "built_at": now_iso(),
           "edgert_version": __version__,
           "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in info.inputs],
           "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in info.outputs],
           "built_from": str(parsed.path) if parsed.path != info.path else ""},
    )
    sidecar = write_sidecar(engine, record)
    return BuildResult(engine, sidecar, "rebuilt" if existed else "built", reason, record)
