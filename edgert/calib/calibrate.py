"""``calibrate()``: folder of images + FP32 ONNX -> Q/DQ ONNX, TensorRT calibration cache, report.

The steps, each in its own module: draw the images (:mod:`.dataset`), preprocess them with the vision
pipeline's own :class:`~edgert.vision.preprocess.Preprocessor`, stream activation histograms out of ONNX
Runtime (:mod:`.collect`, :mod:`.histograms`), choose ranges, write Q/DQ (:mod:`.qdq`) and the cache
(:mod:`.trt_cache`), check accuracy against FP32 on images the calibration did not use
(:mod:`.comparison`), and if asked, keep the most sensitive layers in float (:mod:`.sensitivity`).

The outputs carry a key (model bytes, preprocessing, method, image set, options): a second run with the
same key finds them up to date and does nothing; any change makes them stale and they are rebuilt.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgert.atomic_file import atomic_path, scratch_folder, sha256_file
from edgert.calib.collect import ActivationCollector
from edgert.calib.dataset import CalibrationImages
from edgert.calib.equalize import Region, equalize, find_regions
from edgert.calib.histograms import Method, TensorHistogram, TensorRange
from edgert.calib.macs import count_macs
from edgert.calib.qdq import DEFAULT_OPS, plan_quantization, prepare_model, shared_ranges, write_qdq
from edgert.calib.sensitivity import find_float_layers
from edgert.calib.summary import format_table, peak_rss_mb, tensor_rows, write_report
from edgert.calib.trt_cache import cache_trt_version, write_cache
from edgert.calib.variants import VARIANTS, known_variants, variant_copies, with_variants
from edgert.config import PipelineConfig
from edgert.errors import CalibrationError, ModelError
from edgert.types import TensorSpec

__all__ = ["CalibrationOptions", "calibrate", "output_paths", "ranges_method", "verdict"]

log = logging.getLogger(__name__)

#: Calibration images (each also mirrored, at half size and in 3x3 mosaics) for the check after calibrating.
CHECK_FRAMES = 16
#: Default mixed-precision target: layers go back to float until mAP vs FP32 on the check set >= 1 - this.
#: Full INT8 stays below 0.95 on both asset detectors with every range method (calibration/README.md).
DEFAULT_MAX_DROP = 0.01


@dataclass(frozen=True)
class CalibrationOptions:
    num: int | None = 32
    method: Method = "percentile"  # measured best on both asset detectors (calibration/README.md)
    percentile: float = 99.999
    seed: int = 0
    ops: tuple[str, ...] = DEFAULT_OPS
    trt_version: str | None = None  # cache header; None: the installed TensorRT's (no cache without one)
    cache_algorithm: str = "EntropyCalibration2"
    max_drop: float | None = DEFAULT_MAX_DROP  # mixed precision until mAP >= 1 - max_drop (None: full INT8)
    #: at most this fraction of the model's multiply-accumulates goes back to float (so >= 90 % stay INT8)
    max_float: float = 0.1
    check: bool = True  # measure accuracy against FP32 after calibrating
    check_frames: int = CHECK_FRAMES
    check_video: str | None = None  # also check (and run the sensitivity pass) on frames of this video
    check_video_frames: int = 40
    check_held_out: bool = False  # check on the folder's unused images instead of calibration images + mirrors
    #: copies of the check images added to the check set (see _check_frames): "mirror", "half", "mosaic",
    #: "mosaic3". The 3x3 mosaics (small objects, crowded frames) bring the check close to street and hall
    #: cameras: on held-out video frames 0.969 against 0.932 without them (calibration/README.md)
    check_variants: tuple[str, ...] = ("mirror", "half", "mosaic3")
    share_scales: tuple[str, ...] = ()  # ops whose inputs and outputs share one INT8 range (qdq.shared_ranges)
    score_frames: int = 8  # frames each layer's sensitivity is scored on
    budget_mb: float = 512.0  # exposed activations per ONNX Runtime run
    threads: int = 0
    exclude_nodes: tuple[str, ...] = ()
    force: bool = False
    engine_size: bool = False  # build the result with TensorRT-RTX (CPU is enough) and report the engine size
    #: empirical bias correction (calib.bias_correction): "none", "local", "output" or "both"
    bias_correction: str = "none"
    bias_images: int = 16  # calibration images the bias shifts and weight roundings are fitted on
    #: weight rounding: "nearest", "gptq" (calib.rounding, GPTQ's step) or "adaround" (calib.adaround, descent on
    #: a soft rounding; measured, not kept: NanoDet -0.031 held out at 300-600 s, calibration/README.md)
    rounding: str = "nearest"
    adaround_iters: int = 300  # AdaRound's descent steps per layer
    #: weight bytes in the float-layer ranking (sensitivity.rank_candidates): cost = MAC share + this x weight
    #: share; 0 ranks by error per MAC alone. 1.0: YOLOv8s's engine 24.9 -> 20.3 MB (calibration/README.md)
    size_weight: float = 1.0
    #: "method": every range from ``method``; "output": each quantized tensor's range picked among histogram
    #: candidates by its consumers' output error (calib.range_search). Measured, not kept (calibration/README.md)
    ranges_by: str = "method"
    #: equalisation (calib.equalize): "none", "activations" (each channel between two convs rescaled, exact in
    #: float, by its range on the calibration images, so per-tensor INT8 ranges are flatter) or "weights" (the
    #: same by weight ranges, data-free CLE); ``equalize_alpha`` SmoothQuant's alpha. "weights": held out +0.043
    #: on YOLOv3-tiny and the video +0.034 on NanoDet over 13 calibration draws (calibration/README.md)
    equalization: str = "weights"
    equalize_alpha: float = 0.5
    #: passes of ``weights`` equalisation over the graph, until its scales stop moving (equalize.equalize), and
    #: regions joined through Adds of two conv outputs (find_regions(through_adds)). Measured, not kept: held out
    #: converged -0.029 (NanoDet) / -0.076 (YOLOv3-tiny), Adds +0.002 +- 0.005 on NanoDet (calibration/README.md)
    equalize_passes: int = 1
    equalize_adds: bool = False
    #: copies of the calibration images the range collection also sees (calib.variants names: "mirror",
    #: "half", "mosaic", "mosaic3", "lowq"), after the images. Measured, not kept: mirror + mosaic3 NanoDet
    #: +0.008 (video +0.045), YOLOv3-tiny -0.020; lowq -0.008 / +0.006 over 6 draws (calibration/README.md)
    calib_variants: tuple[str, ...] = ()
    #: "all": histograms over the images and their copies; "wider": per tensor the larger of that range and the
    #: images' own (the copies widen, never narrow). Not kept: YOLOv3-tiny -0.019 (calibration/README.md)
    variant_ranges: str = "all"
    #: with data-free ``weights`` equalisation, one histogram pass on the equalised model, not two (the cache's
    #: pass only when a cache is written); the default's figures on seed 0, its time not yet measured
    collect_once: bool = False


def output_paths(out: str | Path) -> dict[str, Path]:
    p = Path(out)
    stem = p.with_suffix("") if p.suffix == ".onnx" else p
    return {"onnx": p if p.suffix == ".onnx" else p.with_suffix(".onnx"),
            "cache": Path(f"{stem}.calib"), "report": Path(f"{stem}.report.json"),
            "report_html": Path(f"{stem}.report.html")}


def _load(model: str | Path) -> tuple[onnx.ModelProto, bytes]:
    path = Path(model)
    if not path.is_file():
        raise ModelError(f"{path}: model file not found")
    try:
        data = path.read_bytes()
        return onnx.load_from_string(data), data
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from exc


def _input_spec(model: onnx.ModelProto) -> TensorSpec:
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise CalibrationError(f"image calibration needs a model with one input; this one has {len(inputs)}")
    vi = inputs[0]
    tt = vi.type.tensor_type
    if tt.elem_type != onnx.TensorProto.FLOAT:
        raise CalibrationError(f"input {vi.name} is not float32; INT8 calibration needs a float model")
    dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or -1) for d in tt.shape.dim]
    return TensorSpec(vi.name, tuple(dims), np.dtype(np.float32))


def _key(model_bytes: bytes, config: PipelineConfig, opts: CalibrationOptions, images: str,
         cache_version: str | None = None) -> str:
    from edgert._version import __version__

    h = hashlib.sha256(model_bytes)
    fields = {
        "preprocess": dataclasses.asdict(config.preprocess), "method": opts.method, "percentile": opts.percentile,
        "num": opts.num, "seed": opts.seed, "ops": list(opts.ops), "trt": [cache_version, opts.cache_algorithm],
        "max_drop": [opts.max_drop, opts.max_float],
        "check": [opts.check_frames, opts.check_video, opts.check_video_frames, opts.check_held_out,
                  opts.score_frames, list(opts.check_variants)],
        "share_scales": list(opts.share_scales), "engine_size": opts.engine_size,
        "bias": [opts.bias_correction, opts.bias_images, opts.rounding, opts.adaround_iters],
        "size_weight": opts.size_weight,
        "ranges_by": opts.ranges_by, "equalization": [opts.equalization, opts.equalize_alpha, opts.equalize_passes,
                         opts.equalize_adds],
        "calib_variants": [list(opts.calib_variants), opts.variant_ranges, opts.collect_once],
        "exclude": list(opts.exclude_nodes), "images": images, "edgert": __version__,
    }
    h.update(json.dumps(fields, sort_keys=True, default=str).encode())
    return h.hexdigest()[:24]


def _fresh(paths: dict[str, Path], key: str, with_cache: bool) -> dict[str, Any] | None:
    """The previous report when every output is there, of this key, and byte for byte what was written.

    The report records each output's sha256 (it is written last), so a model or cache damaged or replaced
    since (a truncated copy, an interrupted write by an older edgert) is stale, not "up to date". Without a
    cache (no TensorRT with implicit INT8 here) only the model is checked.
    """
    if not all(p.exists() for k, p in paths.items() if k != "cache" or with_cache):
        return None
    try:
        report: dict[str, Any] = json.loads(paths["report"].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("key") != key:
        return None
    recorded = report.get("sha256")
    if not isinstance(recorded, dict):
        return None  # a report from before hashes were recorded: cannot vouch for the files
    for name in ("onnx", "cache") if with_cache else ("onnx",):
        try:
            if recorded.get(name) != sha256_file(paths[name]):
                log.warning("%s changed since it was written: calibrating again", paths[name])
                return None
        except OSError:
            return None
    return report


def calibrate(model: str | Path, images: str | Path, out: str | Path, config: PipelineConfig | None = None,
              options: CalibrationOptions | None = None, progress: bool = True) -> dict[str, Any]:
    """Calibrate ``model`` on ``images``; writes the outputs of :func:`output_paths` and returns the report."""
    from edgert.vision.preprocess import Preprocessor

    t_start = time.perf_counter()
    config = config or PipelineConfig()
    opts = options or CalibrationOptions()
    paths = output_paths(out)
    fp32, model_bytes = _load(model)
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in fp32.graph.node):
        raise CalibrationError(f"{Path(model).name}: already quantized (it has Q/DQ nodes); calibrate the FP32 model")
    dataset = CalibrationImages(images, num=opts.num, seed=opts.seed)
    cache_version, cache_why = cache_trt_version(opts.trt_version)
    key = _key(model_bytes, config, opts, dataset.fingerprint(), cache_version)
    if not opts.force:
        previous = _fresh(paths, key, cache_version is not None)
        if previous is not None:
            log.info("%s is up to date (same model, images, preprocessing and method)", paths["onnx"])
            previous["up_to_date"] = True
            return previous
    if paths["report"].exists():
        log.info("rebuilding %s: the model, images, preprocessing or method changed", paths["onnx"])

    prepared = prepare_model(fp32)
    plan = plan_quantization(prepared, opts.ops, opts.exclude_nodes)
    if not plan.targets:
        raise CalibrationError(
            f"{model}: no layer of this model can be quantized (no Conv/Gemm/MatMul before its outputs)"
        )
    spec = _input_spec(prepared)
    metadata = {p.key: p.value for p in fp32.metadata_props}
    pre = Preprocessor(config.preprocess, spec, metadata)
    buffer = pre.allocate()
    tensors = [t for t in plan.activation_tensors if t not in plan.tail_tensors]
    if opts.rounding not in ("nearest", "gptq", "adaround"):
        raise CalibrationError(f"unknown weight rounding {opts.rounding!r}; known: nearest, gptq, adaround")
    if opts.adaround_iters < 1:
        raise CalibrationError(f"adaround_iters must be at least 1, got {opts.adaround_iters}")
    if opts.equalization not in ("none", "activations", "weights"):
        raise CalibrationError(f"unknown equalization {opts.equalization!r}; known: none, activations, weights")
    if not 0.0 <= opts.equalize_alpha <= 1.0:
        raise CalibrationError(f"equalize_alpha must be in [0, 1], got {opts.equalize_alpha}")
    if opts.equalize_passes < 1:
        raise CalibrationError(f"equalize_passes must be at least 1, got {opts.equalize_passes}")
    regions: list[Region] = find_regions(prepared, opts.equalize_adds) if opts.equalization != "none" else []
    quantized_now = set(plan.quantized_tensors)
    channel_tensors = {t for r in regions if r.why_not is None for t in r.segments if t in quantized_now
                       and opts.equalization == "activations"}
    known_variants(opts.calib_variants, "calibration variant")
    if opts.variant_ranges not in ("all", "wider"):
        raise CalibrationError(f"unknown variant_ranges {opts.variant_ranges!r}; known: all, wider")
    n_samples = len(dataset) * (1 + len(opts.calib_variants))
    def fill(sample: object, buf: np.ndarray) -> None:
        pre(sample[1], buf)  # type: ignore[index]  # (path, image) pairs from the dataset

    def collect(model_: onnx.ModelProto, names: Sequence[str], first: bool,
                channels: Collection[str] = ()) -> tuple[dict[str, TensorHistogram], dict[str, np.ndarray]]:
        """Histograms of ``names`` on ``model_`` over the images, then their variants (``first``: the draw's
        own pass, filling ``dataset.used``); ``wider``: per tensor the images' own or these, the larger range."""
        from tqdm import tqdm

        c = ActivationCollector(model_, names, budget_mb=opts.budget_mb, threads=opts.threads,
                                channel_tensors=channels)
        draw = dataset if first else CalibrationImages(images, num=opts.num, seed=opts.seed, quiet=True)
        alone: dict[str, TensorHistogram] = {}
        bar = tqdm(with_variants(draw, opts.calib_variants), total=n_samples, desc="calibrating", unit="img",
                   disable=not progress, leave=False)
        for i, sample in enumerate(bar):
            if i == len(dataset) and opts.variant_ranges == "wider":
                alone = copy.deepcopy(c.histograms)  # the images' own histograms, before the copies
            fill(sample, buffer)
            c.update(buffer)
        bar.close()
        c.close()
        got = c.histograms
        if alone:
            got = {n: (h if h.result(opts.method, opts.percentile).amax >= got[n].result(
                opts.method, opts.percentile).amax else got[n]) for n, h in alone.items()}
        return got, c.channel_max

    write_kwargs: dict[str, Any] = {}
    equalization: dict[str, Any] | None = None
    t_collect = t_equalize = 0.0
    if regions and opts.equalization == "weights" and opts.collect_once:
        # data-free scales: equalise first, collect once on the equalised model (its other tensors are the
        # original's to float rounding); the cache's rescaled tensors from the original, only for a cache
        t0 = time.perf_counter()
        equalized, equalization = equalize(prepared, regions, {}, opts.equalize_alpha, opts.equalization,
                                           passes=opts.equalize_passes)
        rescaled = [t for t in tensors if t in set(equalization["rescaled_tensors"])]
        t_equalize = time.perf_counter() - t0
        t0 = time.perf_counter()
        histograms, _ = collect(equalized if rescaled else prepared, tensors, True)
        t_collect = time.perf_counter() - t0
        cache_histograms = histograms
        if rescaled and cache_version is not None:
            t0 = time.perf_counter()
            cache_histograms = {**histograms, **collect(prepared, rescaled, False)[0]}
            t_equalize += time.perf_counter() - t0
        prepared = equalized if rescaled else prepared
    else:
        t0 = time.perf_counter()
        histograms, channel_max = collect(prepared, tensors, True, channel_tensors)
        t_collect = time.perf_counter() - t0
        t0 = time.perf_counter()
        cache_histograms = histograms  # the TensorRT cache is for the FP32 model as given: its own ranges
        if regions:
            equalized, equalization = equalize(prepared, regions, channel_max, opts.equalize_alpha,
                                               opts.equalization, passes=opts.equalize_passes)
            rescaled = [t for t in tensors if t in set(equalization["rescaled_tensors"])]
            if rescaled:
                # the rescaled tensors' histograms again, on the equalised model (a second run per image)
                histograms = {**histograms, **collect(equalized, rescaled, False)[0]}
                prepared = equalized
        t_equalize = time.perf_counter() - t0

    t0 = time.perf_counter()
    ranges: dict[str, TensorRange] = {n: h.result(opts.method, opts.percentile) for n, h in histograms.items()}
    t_ranges = time.perf_counter() - t0
    observed_nonfinite = {n for n, r in ranges.items() if r.nonfinite}
    if observed_nonfinite - plan.nonfinite_tensors:
        log.info("non-finite values seen in %s: those stay float", ", ".join(sorted(observed_nonfinite)))
        plan = plan_quantization(prepared, opts.ops, opts.exclude_nodes, nonfinite=observed_nonfinite)
    amax = {n: r.amax for n, r in ranges.items()}
    if opts.share_scales:
        amax = shared_ranges(prepared, plan, amax, opts.share_scales)

    if opts.ranges_by not in ("method", "output"):
        raise CalibrationError(f"unknown range choice {opts.ranges_by!r}; known: method, output")
    if opts.ranges_by == "output":
        from edgert.calib.range_search import search_ranges

        t0 = time.perf_counter()
        few_images = CalibrationImages(images, num=opts.num, seed=opts.seed, quiet=True)
        amax, _ = search_ranges(prepared, plan, amax, histograms,
                                ({spec.name: (pre(img, buffer), buffer)[1]}
                                 for _, img in itertools.islice(few_images, max(1, opts.score_frames))),
                                threads=opts.threads)
        t_ranges += time.perf_counter() - t0
    t_bias = t_round = 0.0
    rounding_errors: dict[str, dict[str, float]] = {}

    def calib_feeds() -> Iterator[dict[str, np.ndarray]]:
        # the first calibration images, decoded again per pass: nothing is kept between images
        again = CalibrationImages(images, num=opts.num, seed=opts.seed, quiet=True)
        for _, img in itertools.islice(again, max(1, opts.bias_images)):
            pre(img, buffer)
            yield {spec.name: buffer}

    if opts.rounding == "adaround":
        from edgert.calib.adaround import adaround_roundings

        t0 = time.perf_counter()
        write_kwargs["rounding"], rounding_errors = adaround_roundings(prepared, plan, amax, calib_feeds,
                                                                       opts.adaround_iters, threads=opts.threads)
        t_round = time.perf_counter() - t0
    if opts.rounding == "gptq":
        from edgert.calib.rounding import weight_roundings

        t0 = time.perf_counter()
        write_kwargs["rounding"], rounding_errors = weight_roundings(prepared, plan, amax, calib_feeds(),
                                                                     budget_mb=opts.budget_mb, threads=opts.threads)
        t_round = time.perf_counter() - t0
    if opts.bias_correction != "none":
        from edgert.calib.bias_correction import bias_corrections
        from edgert.calib.sensitivity import output_layers

        t0 = time.perf_counter()
        write_kwargs["bias"] = bias_corrections(prepared, plan, amax, calib_feeds, opts.bias_correction,
                                                output_layers(prepared, plan), opts.threads,
                                                write_kwargs.get("rounding"))
        t_bias = time.perf_counter() - t0

    meta = {"edgert.calibration": json.dumps({"key": key, "method": ranges_method(opts), "images": len(dataset.used)})}
    qdq = write_qdq(prepared, plan, amax, metadata=meta, **write_kwargs)
    cache_tensors = [t for t in plan.cache_tensors() if t in ranges and t not in observed_nonfinite]
    macs = count_macs(prepared)

    accuracy: dict[str, Any] | None = None
    sensitivity: dict[str, Any] | None = None
    reasons: dict[str, str] = {}
    t_check = t_sens = 0.0
    float_layers: list[str] = []
    # Candidates are checked from a scratch folder; only the final, checked model goes to -o (atomically).
    with scratch_folder("calib") as scratch:  # a killed run's is removed by the next one
        candidate = scratch / paths["onnx"].name
        if opts.check:
            onnx.save(qdq, str(candidate))
            t0 = time.perf_counter()
            frames, frames_from = _check_frames(images, dataset, opts.check_frames, opts.check_video,
                                                opts.check_video_frames, opts.check_held_out, opts.check_variants)
            reference = _reference(model, frames, config)  # FP32 runs once; every candidate is compared to it
            t_check = time.perf_counter() - t0
            if opts.max_drop is not None and reference is not None:
                # The pass measures the budget's float layers first and full INT8 only when those meet the
                # target: one check-set run fewer in the usual case (the budget misses 0.99). The price: a full
                # INT8 that would meet a target its float layers miss (the curve is noisy) goes unseen, and
                # where full INT8 meets the target the pass costs two runs and the layer errors, not one run.
                t0 = time.perf_counter()

                def feeds(images_: Sequence[np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
                    for img in images_:
                        pre(img, buffer)
                        yield {spec.name: buffer}

                def evaluate(path: Path) -> dict[str, Any]:
                    return _accuracy(model, path, frames, config, reference)

                # layer errors on frames evenly spread over the check set, so each kind of frame in it counts
                few = frames[:: max(1, len(frames) // max(opts.score_frames, 1))][: opts.score_frames]
                sens = find_float_layers(prepared, plan, amax, evaluate, opts.max_drop, feeds(few), macs.layers,
                                         max_float=opts.max_float, log_fn=log.info, write_kwargs=write_kwargs,
                                         size_weight=opts.size_weight, full_int8_measured=False)
                float_layers = sens.float_layers
                reasons = sens.reasons
                sensitivity = sens.to_dict()
                if float_layers:
                    qdq = write_qdq(prepared, plan, amax, exclude_nodes=float_layers, metadata=meta, **write_kwargs)
                if sens.accuracy is not None:  # the chosen model was measured on the check set: that is its figure
                    accuracy = {**sens.accuracy, "frames_from": frames_from}
                t_sens = time.perf_counter() - t0
            if accuracy is None:  # no pass (no target, not a detector, or nothing within the budget)
                t0 = time.perf_counter()
                accuracy = _accuracy(model, candidate, frames, config, reference)
                accuracy["frames_from"] = frames_from
                t_check += time.perf_counter() - t0
    _save(qdq, paths["onnx"])
    final_macs = count_macs(qdq)
    engine: dict[str, Any] | None = None
    if opts.engine_size:
        from edgert.calib.engine_size import rtx_engine_size

        engine = rtx_engine_size(paths["onnx"])

    kept_float = set(float_layers) | set(opts.exclude_nodes)
    if kept_float:
        # Implicit INT8 keeps a layer out of INT8 when a tensor it produces has no scale ("expect fall
        # back to non-int8 implementation for any layer consuming or producing given tensor").
        produced = {t for n in prepared.graph.node if n.name in kept_float for t in n.output}
        cache_tensors = [t for t in cache_tensors if t not in produced]
    if cache_version is not None:
        cache_scales = {t: (cache_histograms[t].result(opts.method, opts.percentile) if cache_histograms[t]
                            is not histograms[t] else ranges[t]).scale for t in cache_tensors}
        write_cache(paths["cache"], cache_scales, cache_version, opts.cache_algorithm)
    else:
        log.info("no TensorRT calibration cache: %s", cache_why)
        try:
            paths["cache"].unlink()  # one from an earlier run would be stale
        except FileNotFoundError:  # none there: nothing stale to remove
            pass
        except OSError as exc:
            raise CalibrationError(f"{paths['cache']}: cannot remove the stale calibration cache: {exc}") from exc

    quantized = list(plan.quantized_tensors)
    if float_layers:
        kept = {t.node for t in plan.targets} - set(float_layers)
        quantized = sorted({a for t in plan.targets if t.node in kept for a in t.activations})
    report: dict[str, Any] = {
        "key": key, "model": str(model), "output": str(paths["onnx"]), "method": ranges_method(opts),
        "max_drop": opts.max_drop, "max_float": opts.max_float,
        "seed": opts.seed,
        "images": {"folder": str(images), "asked": opts.num, "used": len(dataset.used),
                   "skipped": len(dataset.skipped), "used_files": [str(p) for p in dataset.used],
                   "skipped_files": {str(p): why for p, why in dataset.skipped.items()}},
        "preprocess": dataclasses.asdict(config.preprocess),
        "summary": {
            "quantized_layers": len(plan.targets) - len(float_layers), "qdq_tensors": len(quantized),
            "float_layers": len(plan.skipped) + len(float_layers), "cache_tensors": len(cache_tensors),
            "tail_nodes": len(plan.tail_nodes), "int8_mac_share": round(final_macs.share, 4),
            "nonfinite_tensors": sorted(plan.nonfinite_tensors | observed_nonfinite),
        },
        "float_layers": {**plan.skipped, **{n: f"sensitivity: {reasons.get(n, 'kept float')}" for n in float_layers}},
        "macs": final_macs.to_dict(), "engine": engine,
        "verdict": verdict(accuracy, opts, final_macs.share, sensitivity),
        "accuracy": accuracy, "sensitivity": sensitivity, "equalization": equalization,
        "rounding": {"method": opts.rounding, "layers": {n: {k: round(v, 8) for k, v in e.items()}
                                                          for n, e in rounding_errors.items()}},
        "trt_cache": {"version": cache_version, "algorithm": opts.cache_algorithm, "why": cache_why,
                      "written": cache_version is not None},
        "timing_s": {"collect": round(t_collect, 2), "equalize": round(t_equalize, 2),
                     "ranges": round(t_ranges, 2), "rounding": round(t_round, 2),
                     "bias": round(t_bias, 2), "check": round(t_check, 2),
                     "sensitivity": round(t_sens, 2), "total": round(time.perf_counter() - t_start, 2)},
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "files": {k: str(v) for k, v in paths.items() if k != "cache" or cache_version is not None},
        "sha256": {name: sha256_file(paths[name]) for name in ("onnx", "cache")
                   if name != "cache" or cache_version is not None},  # checked by _fresh
        "tensors": tensor_rows(ranges, quantized, cache_tensors, plan.tail_tensors, plan.nonfinite_tensors),
    }
    write_report(paths["report"], report)
    report["table"] = format_table(report)
    return report


def verdict(accuracy: Mapping[str, Any] | None, opts: CalibrationOptions, mac_share: float,
            sensitivity: Mapping[str, Any] | None) -> dict[str, Any]:
    """Whether the accuracy target (mAP vs FP32 on the check set >= 1 - max_drop) is met, and why not.

    ``met`` is None when there is no target (``--full-int8``, ``--no-check``, or a model no decoder knows):
    nothing was promised. ``edgert calibrate`` leads its summary with this and exits 3 when ``met`` is False.
    """
    value = ((accuracy or {}).get("map") or {}).get("map50_95")
    out: dict[str, Any] = {"int8_mac_share": round(mac_share, 4), "min_int8_share": round(1.0 - opts.max_float, 4)}
    if opts.max_drop is None or value is None:
        why = ("full INT8 asked (no accuracy target)" if opts.max_drop is None else
               "accuracy not measured" + (f": {(accuracy or {}).get('skipped')}" if accuracy else " (--no-check)"))
        out.update(met=None, target=None, map50_95=value, why=why)
        return out
    target = 1.0 - opts.max_drop
    met = value >= target
    out.update(met=met, target=round(target, 4), map50_95=value)
    if not met:
        out["why"] = (f"mAP@0.5:0.95 vs FP32 {value:.4f} < {target:.4f} with the float layers the MAC budget "
                      f"allows ({100 * opts.max_float:.0f} % of MACs at most); raise --max-float or --max-drop, "
                      "or give --check-video with the deployment's footage")
    return out


def ranges_method(opts: CalibrationOptions) -> str:
    return f"percentile {opts.percentile:g}" if opts.method == "percentile" else opts.method


def _save(model: onnx.ModelProto, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:  # an interrupted save leaves the old model, never a truncated one
            onnx.save(model, str(tmp))
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot write the quantized model: {exc}") from exc


def _check_frames(images: str | Path, dataset: CalibrationImages, count: int, video: str | None,
                  video_count: int, held_out: bool = False,
                  variants: Sequence[str] = ("mirror", "half", "mosaic3")) -> tuple[list[np.ndarray], str]:
    """The frames the accuracy check and the sensitivity pass judge on.

    Default: up to ``count`` of the calibration images plus, per name in ``variants``, one copy of each
    (:data:`CHECK_VARIANTS`): so the check never uses the images a user keeps apart to evaluate on
    (``edgert compare --skip-used``), and a layer is judged on scenes it did not get its ranges from
    (mirrored, objects move to the other side and asymmetric features change; smaller, a pixel of error
    is more IoU; nine to a frame, a crowd of small objects as a camera over a street or a hall sees it,
    which is where full INT8 loses most). ``held_out``: the folder's images calibration did not use
    instead (the calibration images when there are none). Plus ``video_count`` frames of ``video``.
    At most ``count`` images are decoded, so the set is bounded whatever the number of calibration images.
    """
    known_variants(variants)
    if held_out:
        try:
            held = CalibrationImages(images, seed=1, exclude=frozenset(dataset.used), quiet=True)
            frames = [img for _, img in itertools.islice(held, count)]
            where = f"{len(frames)} images not used for calibration"
        except CalibrationError:
            again = CalibrationImages(images, seed=dataset.seed, quiet=True)
            frames = [img for _, img in itertools.islice(again, count)]
            where = f"{len(frames)} calibration images (the folder has no others)"
    else:
        again = CalibrationImages(images, seed=dataset.seed, exclude=frozenset(dataset.skipped), quiet=True)
        chosen = [img for _, img in itertools.islice(again, min(count, len(dataset.used)))]
        frames = list(chosen)
        for variant in variants:
            frames += list(variant_copies(chosen, variant))
        names = [VARIANTS[v] for v in variants]
        where = f"{len(chosen)} calibration images" + "".join(
            f"{', ' if i < len(names) - 1 else ' and '}{n}" for i, n in enumerate(names))
    if video:
        from edgert.calib.comparison import video_frames

        # halfway between the frames `edgert compare --video` takes: a check set disjoint from that one
        extra = [f for _, f in video_frames(video, video_count, offset=0.5)]
        frames += extra
        where += f" + {len(extra)} frames of {Path(video).name}"
    return frames, where


def _reference(model: str | Path, frames: Sequence[np.ndarray], config: PipelineConfig) -> Any:
    """FP32's detections and outputs on the check frames, or None for a model no decoder knows."""
    from edgert.calib.comparison import detections_on

    try:
        return detections_on(model, frames, config)
    except ModelError:  # _accuracy says why
        return None


def _accuracy(reference: str | Path, candidate: Path, frames: Sequence[np.ndarray],
              config: PipelineConfig, reference_results: Any = None) -> dict[str, Any]:
    from edgert.calib.comparison import compare_detectors

    try:
        return compare_detectors(reference, candidate, ((str(i), f) for i, f in enumerate(frames)), config,
                                 reference_results=reference_results)
    except ModelError as exc:
        # Not a detector the decoders know: the raw output errors still say how close INT8 is.
        log.info("no detection decoder for this model (%s); comparing raw outputs", exc)
        return {"skipped": f"not a known detector: {exc}"}
