"""``calibrate()``: folder of images + FP32 ONNX -> Q/DQ ONNX, TensorRT calibration cache, report.

The steps (:mod:`.steps`), each in its own module below: prepare the graph (:mod:`.qdq`), collect activation
histograms with the vision pipeline's own preprocessing (:mod:`.collect`, :mod:`.histograms`), equalise
(:mod:`.equalize`), choose ranges, check against FP32 on images the calibration did not see as they are
(:mod:`.check`) and keep the most sensitive layers float within a MAC budget (:mod:`.sensitivity`), then write
the Q/DQ model, the TensorRT cache (:mod:`.trt_cache`) and the report (:mod:`.summary`).

The outputs carry a key (model bytes, preprocessing, method, image set, options): a second run with the
same key finds them up to date and does nothing; any change makes them stale and they are rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import onnx

from edgert.atomic_file import atomic_path, sha256_file
from edgert.calib import steps
from edgert.calib.check import verdict
from edgert.calib.dataset import CalibrationImages
from edgert.calib.macs import count_macs
from edgert.calib.options import CHECK_FRAMES, DEFAULT_MAX_DROP, CalibrationOptions, ranges_method
from edgert.calib.summary import format_table, peak_rss_mb, tensor_rows, write_report
from edgert.calib.trt_cache import cache_trt_version
from edgert.config import PipelineConfig
from edgert.errors import CalibrationError, ModelError
from edgert.onnx_file import has_qdq
from edgert.rewrite.fold import fold_constants

__all__ = ["CHECK_FRAMES", "DEFAULT_MAX_DROP", "CalibrationOptions", "calibrate", "output_paths", "ranges_method",
           "verdict"]

log = logging.getLogger(__name__)


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


def _key(model_bytes: bytes, config: PipelineConfig, opts: CalibrationOptions, images: str,
         cache_version: str | None = None) -> str:
    from edgert._version import __version__
    from edgert.calib.qdq import PLACEMENT_VERSION

    h = hashlib.sha256(model_bytes)
    fields = {
        "preprocess": dataclasses.asdict(config.preprocess), "method": opts.method, "percentile": opts.percentile,
        "num": opts.num, "seed": opts.seed, "ops": list(opts.ops), "trt": [cache_version, opts.cache_algorithm],
        "max_drop": [opts.max_drop, opts.max_float],
        "check": [opts.check_frames, opts.check_video, opts.check_video_frames, opts.check_held_out,
                  opts.score_frames, list(opts.check_variants)],
        "share_scales": list(opts.share_scales), "engine_size": opts.engine_size, "size_weight": opts.size_weight,
        "equalization": [opts.equalization, opts.equalize_alpha],
        "exclude": list(opts.exclude_nodes), "images": images, "edgert": __version__,
        "placement": PLACEMENT_VERSION,
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
    t_start = time.perf_counter()
    config = config or PipelineConfig()
    opts = options or CalibrationOptions()
    paths = output_paths(out)
    fp32, model_bytes = _load(model)
    if has_qdq(fp32.graph):
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

    prep = steps.prepare(fp32, str(model), config, opts)
    stats = steps.collect_statistics(prep, dataset, opts, progress)
    eq = steps.equalize_model(prep, stats, images, opts, progress)
    rng = steps.choose_ranges(eq.model, prep.plan, eq.histograms, opts)
    meta = {"edgert.calibration": json.dumps({"key": key, "method": ranges_method(opts), "images": len(dataset.used)})}
    checked = steps.check_and_search(model, prep, eq.model, rng, images, dataset, config, opts, meta,
                                     paths["onnx"].name)
    # constant subgraphs folded (Q/DQ kept, outputs bit-identical): TensorRT 8.5's Q/DQ optimizer does not finish on
    # a pointwise node of constants, so the file builds with trtexec on JetPack 5 as well as with edgert build
    fold_constants(checked.qdq)
    _save(checked.qdq, paths["onnx"])
    engine: dict[str, Any] | None = None
    if opts.engine_size:
        from edgert.calib.engine_size import rtx_engine_size

        engine = rtx_engine_size(paths["onnx"])
    cache_tensors = steps.write_trt_cache(paths["cache"], eq.model, eq, rng,
                                          set(checked.float_layers) | set(opts.exclude_nodes), cache_version, opts)
    if cache_version is None:
        log.info("no TensorRT calibration cache: %s", cache_why)
    timing = {"collect": stats.seconds, "equalize": eq.seconds, "ranges": rng.seconds,
              "check": checked.check_seconds, "sensitivity": checked.search_seconds,
              "total": time.perf_counter() - t_start}
    report = _report(model, images, paths, key, opts, config, dataset, eq, rng, checked, cache_tensors, engine,
                     (cache_version, cache_why), timing)
    write_report(paths["report"], report)
    report["table"] = format_table(report)
    return report


def _report(model: str | Path, images: str | Path, paths: dict[str, Path], key: str, opts: CalibrationOptions,
            config: PipelineConfig, dataset: CalibrationImages, eq: steps.Equalized, rng: steps.Ranges,
            checked: steps.Checked, cache_tensors: list[str], engine: dict[str, Any] | None,
            cache: tuple[str | None, str | None], timing: dict[str, float]) -> dict[str, Any]:
    """The JSON report: what was calibrated on, what stayed float and why, the check, the verdict, the times."""
    plan, float_layers = rng.plan, list(checked.float_layers)
    final_macs = count_macs(checked.qdq)
    quantized = list(plan.quantized_tensors)
    if float_layers:
        kept = {t.node for t in plan.targets} - set(float_layers)
        quantized = sorted({a for t in plan.targets if t.node in kept for a in t.activations})
    written = cache[0] is not None
    return {
        "key": key, "model": str(model), "output": str(paths["onnx"]), "method": ranges_method(opts),
        "max_drop": opts.max_drop, "max_float": opts.max_float, "seed": opts.seed,
        "images": {"folder": str(images), "asked": opts.num, "used": len(dataset.used),
                   "skipped": len(dataset.skipped), "used_files": [str(p) for p in dataset.used],
                   "skipped_files": {str(p): why for p, why in dataset.skipped.items()}},
        "preprocess": dataclasses.asdict(config.preprocess),
        "summary": {
            "quantized_layers": len(plan.targets) - len(float_layers), "qdq_tensors": len(quantized),
            "float_layers": len(plan.skipped) + len(float_layers), "cache_tensors": len(cache_tensors),
            "tail_nodes": len(plan.tail_nodes), "int8_mac_share": round(final_macs.share, 4),
            "nonfinite_tensors": sorted(plan.nonfinite_tensors | rng.nonfinite),
        },
        "float_layers": {**plan.skipped, **{n: f"sensitivity: {checked.reasons.get(n, 'kept float')}"
                                            for n in float_layers}},
        "macs": final_macs.to_dict(), "engine": engine,
        "verdict": verdict(checked.accuracy, opts, final_macs.share, checked.sensitivity),
        "accuracy": checked.accuracy, "sensitivity": checked.sensitivity, "equalization": eq.report,
        "trt_cache": {"version": cache[0], "algorithm": opts.cache_algorithm, "why": cache[1], "written": written},
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "files": {k: str(v) for k, v in paths.items() if k != "cache" or written},
        "sha256": {name: sha256_file(paths[name]) for name in ("onnx", "cache")
                   if name != "cache" or written},  # checked by _fresh
        "tensors": tensor_rows(rng.ranges, quantized, cache_tensors, plan.tail_tensors, plan.nonfinite_tensors),
    }


def _save(model: onnx.ModelProto, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:  # an interrupted save leaves the old model, never a truncated one
            onnx.save(model, str(tmp))
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot write the quantized model: {exc}") from exc
