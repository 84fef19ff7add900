"""The steps of a calibration, each returning a small frozen value: prepare the graph, collect statistics,
equalise, choose ranges, check and keep sensitive layers float, write the outputs.

:func:`edgert.calib.calibrate.calibrate` runs them in this order; each step's value is what the next ones and
the report read, so no step reaches into another's locals.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from edgert.atomic_file import remove_stale_temps, scratch_folder
from edgert.calib.check import accuracy, check_frames, reference
from edgert.calib.collect import ActivationCollector
from edgert.calib.dataset import CalibrationImages
from edgert.calib.equalize import Region, equalize, find_regions
from edgert.calib.histograms import TensorHistogram, TensorRange
from edgert.calib.macs import count_macs
from edgert.calib.options import CalibrationOptions
from edgert.calib.qdq import GraphPlan, plan_quantization, prepare_model, shared_ranges, write_qdq
from edgert.calib.sensitivity import find_float_layers
from edgert.calib.trt_cache import write_cache
from edgert.config import PipelineConfig
from edgert.errors import CalibrationError
from edgert.types import TensorSpec

__all__ = ["Checked", "Equalized", "Prepared", "Ranges", "Statistics", "check_and_search", "choose_ranges",
           "collect_statistics", "equalize_model", "prepare", "write_trt_cache"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """The graph ready to calibrate: what gets quantized, how images become its input."""

    model: onnx.ModelProto
    plan: GraphPlan
    spec: TensorSpec
    fill: Callable[[np.ndarray], np.ndarray]  # an image into the one input buffer (returned)
    tensors: tuple[str, ...]  # activations whose ranges are collected
    regions: tuple[Region, ...]  # where equalisation may rescale channels
    channel_tensors: frozenset[str]  # tensors whose per-channel maxima equalisation by activations needs


@dataclass(frozen=True)
class Statistics:
    histograms: Mapping[str, TensorHistogram]
    channel_max: Mapping[str, np.ndarray]
    seconds: float


@dataclass(frozen=True)
class Equalized:
    """The model the Q/DQ graph is written from, its histograms, and the FP32 model's (for the TensorRT cache)."""

    model: onnx.ModelProto
    histograms: Mapping[str, TensorHistogram]
    cache_histograms: Mapping[str, TensorHistogram]
    report: Mapping[str, Any] | None
    seconds: float


@dataclass(frozen=True)
class Ranges:
    ranges: Mapping[str, TensorRange]
    amax: Mapping[str, float]
    plan: GraphPlan  # re-planned when non-finite values were seen
    nonfinite: frozenset[str]
    seconds: float


@dataclass(frozen=True)
class Checked:
    """The Q/DQ model to write, the layers kept float and why, and what the check measured."""

    qdq: onnx.ModelProto
    float_layers: tuple[str, ...]
    reasons: Mapping[str, str]
    accuracy: Mapping[str, Any] | None
    sensitivity: Mapping[str, Any] | None
    check_seconds: float
    search_seconds: float


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


def prepare(fp32: onnx.ModelProto, name: str, config: PipelineConfig, opts: CalibrationOptions) -> Prepared:
    """The model shape-inferred and planned; the preprocessing of the vision pipeline; the equalisable regions."""
    from edgert.vision.preprocess import Preprocessor

    model = prepare_model(fp32)
    plan = plan_quantization(model, opts.ops, opts.exclude_nodes)
    if not plan.targets:
        raise CalibrationError(f"{name}: no layer of this model can be quantized (no Conv/Gemm/MatMul before its "
                               "outputs)")
    spec = _input_spec(model)
    pre = Preprocessor(config.preprocess, spec, {p.key: p.value for p in fp32.metadata_props})
    buffer = pre.allocate()

    def fill(image: np.ndarray) -> np.ndarray:
        pre(image, buffer)
        return buffer

    regions = tuple(find_regions(model)) if opts.equalization != "none" else ()
    quantized = set(plan.quantized_tensors)
    channels = frozenset(t for r in regions if r.why_not is None for t in r.segments if t in quantized) \
        if opts.equalization == "activations" else frozenset()
    tensors = tuple(t for t in plan.activation_tensors if t not in plan.tail_tensors)
    return Prepared(model, plan, spec, fill, tensors, regions, channels)


def _collect(prep: Prepared, model: onnx.ModelProto, names: Sequence[str], images: Iterator[tuple[Any, np.ndarray]],
             total: int, opts: CalibrationOptions, progress: bool,
             channels: Collection[str] = ()) -> tuple[dict[str, TensorHistogram], dict[str, np.ndarray]]:
    """Histograms of ``names`` on ``model`` over ``images`` (and per-channel maxima of ``channels``)."""
    from tqdm import tqdm

    collector = ActivationCollector(model, names, budget_mb=opts.budget_mb, threads=opts.threads,
                                    channel_tensors=channels)
    for _, image in tqdm(images, total=total, desc="calibrating", unit="img", disable=not progress, leave=False):
        collector.update(prep.fill(image))
    collector.close()
    return collector.histograms, collector.channel_max


def collect_statistics(prep: Prepared, dataset: CalibrationImages, opts: CalibrationOptions,
                       progress: bool) -> Statistics:
    """One pass over the calibration images (it fills ``dataset.used``): every tensor's histogram."""
    t0 = time.perf_counter()
    histograms, channel_max = _collect(prep, prep.model, prep.tensors, iter(dataset), len(dataset), opts, progress,
                                       prep.channel_tensors)
    return Statistics(histograms, channel_max, time.perf_counter() - t0)


def equalize_model(prep: Prepared, stats: Statistics, images: str | Path, opts: CalibrationOptions,
                   progress: bool) -> Equalized:
    """Channels rescaled between convs (exact in float), and the rescaled tensors' histograms collected again on
    the equalised model. The TensorRT cache is read with the FP32 model as given: it keeps the first pass's."""
    t0 = time.perf_counter()
    if not prep.regions:
        return Equalized(prep.model, stats.histograms, stats.histograms, None, 0.0)
    equalized, report = equalize(prep.model, list(prep.regions), stats.channel_max, opts.equalize_alpha,
                                 opts.equalization)
    rescaled = [t for t in prep.tensors if t in set(report["rescaled_tensors"])]
    if not rescaled:
        return Equalized(prep.model, stats.histograms, stats.histograms, report, time.perf_counter() - t0)
    again = CalibrationImages(images, num=opts.num, seed=opts.seed, quiet=True)
    histograms = {**stats.histograms, **_collect(prep, equalized, rescaled, iter(again), len(again), opts,
                                                 progress)[0]}
    return Equalized(equalized, histograms, stats.histograms, report, time.perf_counter() - t0)


def choose_ranges(model: onnx.ModelProto, plan: GraphPlan, histograms: Mapping[str, TensorHistogram],
                  opts: CalibrationOptions) -> Ranges:
    """Each tensor's INT8 range by the method; a tensor that saw non-finite values stays float."""
    t0 = time.perf_counter()
    ranges = {n: h.result(opts.method, opts.percentile) for n, h in histograms.items()}
    nonfinite = frozenset(n for n, r in ranges.items() if r.nonfinite)
    if nonfinite - plan.nonfinite_tensors:
        log.info("non-finite values seen in %s: those stay float", ", ".join(sorted(nonfinite)))
        plan = plan_quantization(model, opts.ops, opts.exclude_nodes, nonfinite=set(nonfinite))
    amax = {n: r.amax for n, r in ranges.items()}
    if opts.share_scales:
        amax = shared_ranges(model, plan, amax, opts.share_scales)
    return Ranges(ranges, amax, plan, nonfinite, time.perf_counter() - t0)


def check_and_search(fp32_path: str | Path, prep: Prepared, model: onnx.ModelProto, rng: Ranges,
                     images: str | Path, dataset: CalibrationImages, config: PipelineConfig,
                     opts: CalibrationOptions, metadata: Mapping[str, str], output_name: str) -> Checked:
    """The Q/DQ model checked against FP32 on the check set; with a target, the sensitive layers within the MAC
    budget go back to float (:func:`~edgert.calib.sensitivity.find_float_layers`).

    The pass measures the budget's float layers first and full INT8 only when those meet the target: one
    check-set run fewer in the usual case. Candidates are written to a scratch folder; only the final model
    goes to the output.
    """
    qdq = write_qdq(model, rng.plan, dict(rng.amax), metadata=metadata)
    if not opts.check:
        remove_stale_temps(tempfile.gettempdir(), "edgert-calib.")  # a killed run's scratch, as a checked run does
        return Checked(qdq, (), {}, None, None, 0.0, 0.0)
    t0 = time.perf_counter()
    frames, frames_from = check_frames(images, dataset, opts.check_frames, opts.check_video,
                                       opts.check_video_frames, opts.check_held_out, opts.check_variants)
    ref = reference(fp32_path, frames, config)  # FP32 runs once; every candidate is compared to it
    t_check, t_search = time.perf_counter() - t0, 0.0
    float_layers: tuple[str, ...] = ()
    reasons: Mapping[str, str] = {}
    acc: dict[str, Any] | None = None
    sensitivity: dict[str, Any] | None = None
    with scratch_folder("calib") as scratch:  # a killed run's is removed by the next one
        candidate = scratch / output_name
        onnx.save(qdq, str(candidate))
        if opts.max_drop is not None and ref is not None:
            t0 = time.perf_counter()
            # layer errors on frames evenly spread over the check set, so each kind of frame in it counts
            few = frames[:: max(1, len(frames) // max(opts.score_frames, 1))][: opts.score_frames]
            sens = find_float_layers(
                model, rng.plan, dict(rng.amax), lambda path: accuracy(fp32_path, path, frames, config, ref),
                opts.max_drop, ({prep.spec.name: prep.fill(f)} for f in few), count_macs(model).layers,
                max_float=opts.max_float, log_fn=log.info, size_weight=opts.size_weight, full_int8_measured=False)
            float_layers, reasons, sensitivity = tuple(sens.float_layers), sens.reasons, sens.to_dict()
            if float_layers:
                qdq = write_qdq(model, rng.plan, dict(rng.amax), exclude_nodes=float_layers, metadata=metadata)
            if sens.accuracy is not None:  # the chosen model was measured on the check set: that is its figure
                acc = {**sens.accuracy, "frames_from": frames_from}
            t_search = time.perf_counter() - t0
        if acc is None:  # no pass (no target, not a detector, or nothing within the budget)
            t0 = time.perf_counter()
            acc = {**accuracy(fp32_path, candidate, frames, config, ref), "frames_from": frames_from}
            t_check += time.perf_counter() - t0
    return Checked(qdq, float_layers, reasons, acc, sensitivity, t_check, t_search)


def write_trt_cache(path: Path, model: onnx.ModelProto, eq: Equalized, rng: Ranges, kept_float: Collection[str],
                    version: str | None, opts: CalibrationOptions) -> list[str]:
    """The TensorRT calibration cache (implicit INT8) for the FP32 model as given; the tensors it holds.

    Implicit INT8 keeps a layer out of INT8 when a tensor it produces has no scale ("expect fall back to non-int8
    implementation for any layer consuming or producing given tensor"): the float layers' outputs are left out.
    Without a TensorRT version no cache is written, and one from an earlier run is removed (it would be stale).
    """
    tensors = [t for t in rng.plan.cache_tensors() if t in rng.ranges and t not in rng.nonfinite]
    produced = {t for n in model.graph.node if n.name in set(kept_float) for t in n.output}
    tensors = [t for t in tensors if t not in produced]
    if version is None:
        try:
            path.unlink(missing_ok=True)  # none there: nothing stale to remove
        except OSError as exc:
            raise CalibrationError(f"{path}: cannot remove the stale calibration cache: {exc}") from exc
        return tensors
    scales = {t: (eq.cache_histograms[t].result(opts.method, opts.percentile) if eq.cache_histograms[t]
                  is not eq.histograms[t] else rng.ranges[t]).scale for t in tensors}
    write_cache(path, scales, version, opts.cache_algorithm)
    return tensors

