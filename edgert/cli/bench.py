"""``edgert bench``: trtexec-like latency and throughput of a model on any backend.

Warm-up, then N timed ``infer()`` calls (or a duration): latency percentiles and throughput of the whole
session call, host copies included. GPU sessions add CUDA-event timings of host-to-device, compute and
device-to-host, and a second loop of compute alone (no copies), so the ratio of end-to-end throughput to
compute-only throughput says how much the copies cost. ``--power`` samples the machine's power meter
during the timed loop (watts, mJ per frame).

``--batch 1,2,4,8`` measures batch sizes so a user can pick one: a batch-1 ONNX model's batch is made
dynamic first (:func:`edgert.rewrite.batch.batched_model_path`: rewritten, checked on ONNX Runtime CPU,
cached by sha256), then each size gets its own session (``shapes={input: (B, ...)}``) and the table gives
calls/s, frames/s (B x calls/s) and p50/p99 latency per call; on GPU sessions also compute-only frames/s.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgert.cli.progress import Progress

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    from edgert.backends import backend_names

    p = subparsers.add_parser(
        "bench", help="measure latency, throughput and (GPU) the copy/compute split of a model on a backend")
    p.add_argument("model", help="ONNX model or engine file")
    p.add_argument("--backend", default="auto", help=", ".join(["auto", *backend_names()]))
    p.add_argument("--iterations", type=int, default=200, help="timed iterations (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed iterations first (default 20)")
    p.add_argument("--duration", type=float, metavar="S", help="time for S seconds instead of --iterations")
    p.add_argument("--shapes", action="append", default=[], metavar="NAME:DIMS",
                   help="shape of a dynamic input (NAME:MIN/OPT/MAX builds a TensorRT profile, OPT is run)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "int8", "best"),
                   help="TensorRT backends: engine precision (built and cached if needed)")
    p.add_argument("--precisions", metavar="LIST",
                   help="TensorRT backends: compare precisions, e.g. fp32,fp16,int8 (one table)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (onnxruntime CPU); 0: its default")
    p.add_argument("--power", action="store_true", help="sample the power meter during the timed loop")
    p.add_argument("--power-hz", type=float, default=20.0, help="power sample rate (default 20 Hz)")
    p.add_argument("--batch", metavar="LIST",
                   help="measure these batch sizes, e.g. 1,2,4,8 (a batch-1 ONNX model's batch is made dynamic "
                        "first, checked and cached); throughput in frames/s = batch x calls/s")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--report", metavar="PATH.html",
                   help="also write an HTML page with charts of the results (latency per iteration, histogram, "
                        "percentiles and throughput per setting, watts)")
    p.set_defaults(func=run)


def _percentiles(values_ms: list[float]) -> dict[str, float]:
    a = np.asarray(values_ms, dtype=np.float64)
    if a.size == 0:
        return {}
    return {
        "mean": float(a.mean()), "min": float(a.min()), "max": float(a.max()),
        "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
        "p95": float(np.percentile(a, 95)), "p99": float(np.percentile(a, 99)),
    }


def fill_inputs(session: Any, seed: int = 0) -> None:
    """Deterministic data in every input buffer: images-like floats in [0, 1), small integers otherwise."""
    rng = np.random.default_rng(seed)
    for buf in session.inputs.values():
        if np.issubdtype(buf.dtype, np.floating):
            buf[...] = rng.random(buf.shape, dtype=np.float32).astype(buf.dtype, copy=False)
        elif buf.dtype == np.bool_:
            buf[...] = False
        else:
            buf[...] = 1


def _timed_loop(call: Any, iterations: int, duration: float | None, per_iter: Any = None) -> tuple[list[float], float]:
    lat: list[float] = []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        lat.append((t1 - t0) * 1e3)
        if per_iter is not None:
            per_iter()
        if duration is not None:
            if t1 - t_start >= duration:
                break
        elif len(lat) >= iterations:
            break
    return lat, time.perf_counter() - t_start


def _open_power(hz: float) -> tuple[Any, str | None]:
    """(sampler factory, note). The note is one line when watts cannot be measured here."""
    try:
        from edgert.power import PowerSampler, open_meter  # type: ignore[attr-defined, unused-ignore]
    except ImportError as exc:
        return None, f"power: edgert.power is not available ({exc}); not measured"
    meter = open_meter("auto")
    if not getattr(meter, "available", False):
        return None, f"power: {getattr(meter, 'description', 'no power meter')} (null meter); watts not measured"
    return (lambda: PowerSampler(meter, hz)), None


def bench_session(session: Any, iterations: int = 200, warmup: int = 20, duration: float | None = None,
                  power_hz: float | None = None, trace: dict[str, Any] | None = None,
                  tick: Callable[[], None] | None = None) -> dict[str, Any]:
    """Measure an open session. Returns JSON-ready figures (milliseconds, frames per second).

    ``trace``, when given, receives the raw series for a report: ``latency_ms`` (each timed iteration)
    and, when watts were sampled, ``watts`` as (seconds since the first sample, watts) pairs. ``tick`` is
    called after every call of the model (warm-up included): a progress bar's update.
    """
    from edgert.backends.gpu_session import GpuSession

    fill_inputs(session)
    is_gpu = isinstance(session, GpuSession)
    for _ in range(max(warmup, 0)):
        session.infer()
        if tick is not None:
            tick()
    result: dict[str, Any] = {"backend": session.backend_name, "inputs": {k: list(v.shape) for k, v in
                                                                       session.inputs.items()}}
    splits: list[dict[str, float]] = []
    power_summary: dict[str, Any] | None = None
    power_note: str | None = None
    sampler_factory = None
    if power_hz:
        sampler_factory, power_note = _open_power(power_hz)

    def keep_split() -> None:
        if session.last_timing:
            splits.append(dict(session.last_timing))
        if tick is not None:
            tick()

    if is_gpu:
        session.timing = True
    if sampler_factory is not None:
        with sampler_factory() as sampler:
            lat, total = _timed_loop(session.infer, iterations, duration, keep_split if is_gpu else tick)
            sampler.add_frames(len(lat))
        power_summary = sampler.summary()
        if trace is not None:
            samples = sampler.samples()
            t0 = samples[0].reading.time if samples else 0.0
            trace["watts"] = [(s.reading.time - t0, s.reading.total_w) for s in samples]
    else:
        lat, total = _timed_loop(session.infer, iterations, duration, keep_split if is_gpu else tick)
    if is_gpu:
        session.timing = False
    n = len(lat)
    if trace is not None:
        trace["latency_ms"] = lat
    result.update({"iterations": n, "latency_ms": _percentiles(lat), "throughput_fps": n / total if total else 0.0})
    if is_gpu:
        # Timing events cost a little; the compute-only loop runs without them, like the copies-included loop.
        gpu: dict[str, Any] = {}
        for key in ("h2d_ms", "compute_ms", "d2h_ms"):
            gpu[key] = _percentiles([s[key] for s in splits])
        for _ in range(max(warmup, 1)):
            session.compute_only()
        c_lat, c_total = _timed_loop(session.compute_only, n, None, tick)
        compute_fps = len(c_lat) / c_total if c_total else 0.0
        gpu["compute_only_latency_ms"] = _percentiles(c_lat)
        gpu["compute_only_fps"] = compute_fps
        gpu["end_to_end_over_compute"] = result["throughput_fps"] / compute_fps if compute_fps else None
        result["gpu"] = gpu
    if power_summary is not None:
        result["power"] = power_summary
        if power_summary.get("energy_j") is not None and n:
            result["power"]["mj_per_frame"] = power_summary["energy_j"] * 1e3 / n
    if power_note:
        result["power_note"] = power_note
    return result


def _model_for_backend(model: Path, backend: str, precision: str, shapes: list[str]) -> tuple[Path, str | None]:
    """TensorRT backends run engines: build (or reuse) one for an ONNX model. Returns (path, build summary)."""
    from edgert.backends import builds_engines

    if not builds_engines(backend) or model.suffix.lower() != ".onnx":
        return model, None
    from edgert.builder import parse_shapes
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.builder.onnx_info import file_sha256
    from edgert.builder.timing_cache import default_cache_dir

    # Engines for benchmarking go to the cache, not beside the model (which may be read-only or shared).
    out = default_cache_dir() / "engines" / f"{model.stem}-{file_sha256(model)[:12]}.{backend}.{precision}.engine"
    res = build_engine(model, out, BuildOptions(backend=backend, precision=precision,
                                                profiles=tuple(parse_shapes(shapes))))
    return res.engine, res.summary()


def _run_shapes(shapes: list[str]) -> dict[str, tuple[int, ...]]:
    from edgert.builder.onnx_info import parse_shapes

    return {p.name: p.opt for p in parse_shapes(shapes)}


def _progress(args: argparse.Namespace, session: Any, label: str) -> Progress:
    """Calls of the model: warm-up and timed ones (and the compute-only loop of a GPU session); --duration's
    count is not known ahead."""
    from edgert.backends.gpu_session import GpuSession

    total = None
    if args.duration is None:
        total = max(args.warmup, 0) + args.iterations
        if isinstance(session, GpuSession):
            total += args.iterations
    return Progress(label, total, unit="call", quiet=args.json)


def _bench_one(args: argparse.Namespace, backend: str, precision: str,
               trace: dict[str, Any] | None = None) -> dict[str, Any]:
    from edgert.backends import SessionOptions, get_backend

    be = get_backend(backend)
    path, built = _model_for_backend(Path(args.model), be.name, precision, args.shapes)
    options = SessionOptions(threads=args.threads, shapes=_run_shapes(args.shapes))
    label = f"bench {Path(args.model).name}" + (f" {precision}" if built else "")
    with be.open(path, options) as session, _progress(args, session, label) as progress:
        res = bench_session(session, args.iterations, args.warmup, args.duration,
                            args.power_hz if args.power else None, trace, progress.update)
    res.update({"model": str(args.model), "backend": be.name, "precision": precision if built else None})
    if built:
        res["engine"] = {"path": str(path), "build": built}
    return res


def batch_inputs(model: Path, shapes: list[str]) -> dict[str, tuple[int, ...]]:
    """The inputs with a dynamic first dimension and their other dims (from the model, or --shapes OPT)."""

    from edgert.errors import ConfigError
    from edgert.onnx_file import read_onnx

    graph = read_onnx(model, weights=False).graph
    inits = {t.name for t in graph.initializer}
    given = _run_shapes(shapes) if shapes else {}
    out: dict[str, tuple[int, ...]] = {}
    for vi in graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if not dims or dims[0].HasField("dim_value"):
            continue
        if vi.name in given:
            out[vi.name] = tuple(given[vi.name][1:])
            continue
        rest = tuple(int(d.dim_value) for d in list(dims)[1:] if d.HasField("dim_value"))
        if len(rest) != len(dims) - 1:
            raise ConfigError(f"{model.name}: input {vi.name} has dynamic dimensions besides the batch; give them "
                              f"with --shapes {vi.name}:1x...")
        out[vi.name] = rest
    if not out:
        raise ConfigError(f"{model.name}: no input has a dynamic batch dimension")
    return out


def bench_batches(args: argparse.Namespace, batches: list[int]) -> dict[str, Any]:
    """One session per batch size on the (rewritten if needed) model; frames/s = batch x calls/s."""
    from edgert.backends import SessionOptions, builds_engines, get_backend
    from edgert.errors import ConfigError
    from edgert.rewrite.batch import batched_model_path

    be = get_backend(args.backend)
    src = Path(args.model)
    if src.suffix.lower() != ".onnx":
        raise ConfigError("--batch takes an ONNX model (an engine's batch sizes are fixed by its profiles)")
    model = batched_model_path(src) if max(batches) > 1 else src
    result: dict[str, Any] = {"model": str(src), "backend": be.name,
                              "batched_model": None if model == src else str(model), "batches": []}
    rest = batch_inputs(model, args.shapes) if model != src or max(batches) > 1 else {}
    path, built = model, None
    if builds_engines(be.name):
        hi = max(batches)
        profile = [f"{n}:{'x'.join(str(d) for d in (1, *r))}/{'x'.join(str(d) for d in (hi, *r))}/"
                   f"{'x'.join(str(d) for d in (hi, *r))}" for n, r in rest.items()]
        path, built = _model_for_backend(model, be.name, args.precision, profile)
        result["engine"] = {"path": str(path), "build": built}
    for b in batches:
        shapes = {n: (b, *r) for n, r in rest.items()}
        options = SessionOptions(threads=args.threads, shapes=shapes)
        with be.open(path, options) as session, _progress(args, session, f"bench batch {b}") as progress:
            res = bench_session(session, args.iterations, args.warmup, args.duration,
                                args.power_hz if args.power else None, tick=progress.update)
        res["batch"] = b
        res["calls_per_s"] = res["throughput_fps"]
        res["frames_per_s"] = b * res["throughput_fps"]
        gpu = res.get("gpu")
        if gpu and gpu.get("compute_only_fps"):
            gpu["compute_only_frames_per_s"] = b * gpu["compute_only_fps"]
        power = res.get("power")
        if power and power.get("mj_per_frame") is not None:
            power["mj_per_frame"] = power["mj_per_frame"] / b  # bench_session counts calls, not frames
        result["batches"].append(res)
    return result


def _fmt_batches(result: dict[str, Any]) -> str:
    lines = [f"model        {result['model']}"]
    if result.get("batched_model"):
        lines.append(f"batched      {result['batched_model']} (batch made dynamic, checked)")
    lines.append(f"backend      {result['backend']}")
    gpu = any(r.get("gpu") for r in result["batches"])
    head = f"{'batch':>5} {'calls/s':>9} {'frames/s':>9} {'p50 ms':>9} {'p99 ms':>9}"
    lines.append(head + (f" {'compute frames/s':>17}" if gpu else ""))
    for r in result["batches"]:
        lat = r["latency_ms"]
        row = (f"{r['batch']:>5} {r['calls_per_s']:>9.1f} {r['frames_per_s']:>9.1f} {lat['p50']:>9.2f} "
               f"{lat['p99']:>9.2f}")
        g = r.get("gpu") or {}
        if gpu:
            row += f" {g.get('compute_only_frames_per_s', 0.0):>17.1f}"
        lines.append(row)
    lines.append("latency is per call (a whole batch); frames/s = batch x calls/s")
    return "\n".join(lines)


def _fmt(res: dict[str, Any]) -> str:
    lat = res["latency_ms"]
    lines = [
        f"model        {res['model']}",
        f"backend      {res['backend']}" + (f" ({res['precision']})" if res.get("precision") else ""),
        f"inputs       {', '.join(f'{k} {tuple(v)}' for k, v in res['inputs'].items())}",
        f"iterations   {res['iterations']}",
        f"latency ms   p50 {lat['p50']:.3f}  p90 {lat['p90']:.3f}  p95 {lat['p95']:.3f}  p99 {lat['p99']:.3f}  "
        f"mean {lat['mean']:.3f}  min {lat['min']:.3f}",
        f"throughput   {res['throughput_fps']:.1f} inferences/s (session.infer, host copies included)",
    ]
    gpu = res.get("gpu")
    if gpu:
        lines += [
            f"gpu split ms h2d {gpu['h2d_ms']['p50']:.3f}  compute {gpu['compute_ms']['p50']:.3f}  "
            f"d2h {gpu['d2h_ms']['p50']:.3f}  (p50, CUDA events)",
            f"compute only {gpu['compute_only_fps']:.1f} inferences/s, "
            f"p50 {gpu['compute_only_latency_ms']['p50']:.3f} ms",
            f"ratio        end-to-end / compute-only throughput = {gpu['end_to_end_over_compute']:.3f}",
        ]
    pw = res.get("power")
    if pw and pw.get("avg_w") is not None:
        mj = pw.get("mj_per_frame")
        lines.append(f"power        avg {pw['avg_w']:.2f} W  peak {pw['peak_w']:.2f} W  "
                     f"{'' if mj is None else f'{mj:.2f} mJ/frame'}  ({pw.get('meter')})")
    if res.get("power_note"):
        lines.append(res["power_note"])
    if res.get("engine"):
        lines.append(f"engine       {res['engine']['build']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from edgert.errors import ConfigError

    if args.iterations <= 0 or args.warmup < 0 or (args.duration is not None and args.duration <= 0):
        raise ConfigError("--iterations and --duration must be positive, --warmup 0 or more")
    if args.report:
        from edgert.report.page import check_writable

        check_writable(args.report)  # before minutes of benchmarking, not after
    if args.batch:
        from edgert.cli.rebatch import parse_batches

        batches = parse_batches(args.batch, "--batch")
        if not batches:
            raise ConfigError("--batch: give batch sizes, e.g. 1,2,4,8")
        if args.precisions:
            raise ConfigError("--batch and --precisions: measure one at a time")
        result = bench_batches(args, batches)
        print(json.dumps(result, indent=2) if args.json else _fmt_batches(result))
        return 0
    if args.precisions:
        from edgert.backends import builds_engines

        if not builds_engines(args.backend):
            raise ConfigError("--precisions compares TensorRT engine precisions: add --backend tensorrt")
        precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
        bad = [p for p in precisions if p not in ("fp32", "fp16", "int8", "best")]
        if bad:
            raise ConfigError(f"--precisions: {', '.join(bad)} unknown. Note: valid are fp32, fp16, int8, best")
        traces: list[dict[str, Any]] = [{} for _ in precisions]
        results = [_bench_one(args, args.backend, p, t) for p, t in zip(precisions, traces)]
        _write_report(args.report, results, traces)
        if args.json:
            print(json.dumps(results, indent=2))
        else:
            print(f"{'precision':<10} {'p50 ms':>9} {'p99 ms':>9} {'fps':>9} {'compute fps':>12}")
            for r in results:
                g = r.get("gpu") or {}
                cfps = g.get("compute_only_fps")
                print(f"{r['precision']:<10} {r['latency_ms']['p50']:>9.3f} {r['latency_ms']['p99']:>9.3f} "
                      f"{r['throughput_fps']:>9.1f} {'' if cfps is None else f'{cfps:12.1f}'}")
        return 0
    trace: dict[str, Any] = {}
    res = _bench_one(args, args.backend, args.precision, trace)
    _write_report(args.report, [res], [trace])
    print(json.dumps(res, indent=2) if args.json else _fmt(res))
    return 0


def _write_report(path: str | None, results: list[dict[str, Any]], traces: list[dict[str, Any]]) -> None:
    if not path:
        return
    import sys

    from edgert.report.bench import bench_report
    from edgert.report.page import write_page

    write_page(path, bench_report(results, traces))
    print(f"edgert: report written to {path}", file=sys.stderr)
