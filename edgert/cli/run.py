"""``edgert run``: a model on a source, into sinks, until the input ends or a signal stops it.

One YAML file (``--config``) can describe everything (task, model, preprocess, decode, source, sinks,
runtime, power); flags override it. ``--json`` prints the final summary as JSON on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from edgert.pipeline.observer import BaseObserver

log = logging.getLogger(__name__)

SPEECH_TASKS = ("vad", "wakeword", "asr")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run", help="run a detector on a video, images, camera or stream into sinks",
        description="Run a model on a source (video file, image, folder, /dev/videoN, csi://N, rtsp://..., "
                    "gst://...) into sinks (jsonl://PATH, jsonl://-, out.mp4, display://0, "
                    "http://127.0.0.1:8080, rtsp://...). Flags override the --config YAML.",
    )
    add_run_arguments(p)
    p.set_defaults(func=run)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="ONNX model or engine (overrides model.path)")
    p.add_argument("--config", help="pipeline YAML (task, model, preprocess, decode, source, sinks, runtime, power)")
    p.add_argument("--source", help="input URI (overrides source.uri)")
    p.add_argument("--sink", action="append", default=None, metavar="URI",
                   help="output URI, repeatable (replaces the config's sinks)")
    p.add_argument("--task", choices=["detect", *SPEECH_TASKS], help="override the config's task")
    p.add_argument("--max-frames", type=int, metavar="N", help="stop after N frames")
    p.add_argument("--backend", help="auto, onnxruntime, tensorrt, ... (overrides model.backend)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for the backend (0: its default)")
    p.add_argument("--conf", type=float, metavar="X", help="confidence threshold (decode.conf)")
    p.add_argument("--iou", type=float, metavar="X", help="NMS IoU threshold (decode.iou)")
    p.add_argument("--loop", action="store_true", help="restart a video or image folder at its end")
    p.add_argument("--queue-size", type=int, metavar="N", help="frames in flight between stages (runtime.queue_size)")
    p.add_argument("--power-budget", type=float, metavar="WATTS", help="pace the pipeline to stay under WATTS")
    p.add_argument("--rail", help="power rail the budget applies to (power.rail)")
    p.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics at HOST:PORT/metrics")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON on stdout")
    p.add_argument("--report", metavar="PATH.html",
                   help="write an HTML page with FPS, latency and watts over time and the summary at the end")
    g = p.add_argument_group("GPU pipeline (preprocessing and the confidence filter on the GPU; docs/gpu-pipeline.md)")
    g.add_argument("--gpu-pipeline", action="store_true",
                   help="run detection on the GPU pipeline (needs a GPU backend: onnxruntime-cuda by default)")
    g.add_argument("--memory", choices=["auto", "pinned", "zero-copy"], default="auto",
                   help="frame/result memory: zero-copy (mapped, Jetson) or pinned copies; auto picks by device")
    g.add_argument("--slots", type=int, default=3, metavar="N", help="sessions in flight, each with its own stream")
    g.add_argument("--cuda-graph", action="store_true", help="replay the model as a CUDA graph (ORT enable_cuda_graph)")
    g.add_argument("--preload", action="store_true",
                   help="decode the whole source into memory before timing (benchmarks: excludes video decoding)")


# --------------------------------------------------------------------------------------------------
# Flags over config


def _replace(obj: Any, flag_names: dict[str, str], **changes: Any) -> Any:
    """``dataclasses.replace`` whose validation errors name the flag, as one-line ConfigErrors."""
    from edgert.config import FieldError
    from edgert.errors import ConfigError

    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        return obj
    try:
        return dataclasses.replace(obj, **changes)
    except FieldError as exc:
        flag = flag_names.get(exc.field_name, exc.field_name)
        raise ConfigError(f"{flag}: {exc.message}") from None


def build_config(args: argparse.Namespace) -> Any:
    """The pipeline config from ``--config`` (or defaults) with every given flag applied."""
    from edgert.config import PipelineConfig, load_config
    from edgert.errors import ConfigError

    config = load_config(args.config) if args.config else PipelineConfig()
    for name in ("max_frames", "threads", "queue_size"):
        value = getattr(args, name, None)
        if value is not None and value < 0:
            raise ConfigError(f"--{name.replace('_', '-')}: expected a number >= 0, got {value}")
    model = _replace(config.model, {"threads": "--threads", "path": "--model", "backend": "--backend"},
                     path=args.model, backend=args.backend, threads=args.threads)
    decode = _replace(config.decode, {"conf": "--conf", "iou": "--iou"}, conf=args.conf, iou=args.iou)
    source = _replace(config.source, {}, uri=args.source, loop=True if args.loop else None)
    runtime = _replace(config.runtime, {"queue_size": "--queue-size", "max_frames": "--max-frames"},
                       max_frames=args.max_frames, queue_size=args.queue_size)
    power = _replace(config.power, {"budget_w": "--power-budget", "rail": "--rail"},
                     budget_w=args.power_budget, rail=args.rail)
    sinks = tuple(args.sink) if args.sink is not None else None
    return _replace(config, {}, task=args.task, model=model, decode=decode, source=source, runtime=runtime,
                    power=power, sinks=sinks)


# --------------------------------------------------------------------------------------------------
# Optional helpers from other parts of edgert (power budget, systemd, metrics), each used when present


def _optional(module: str) -> Any:
    if importlib.util.find_spec(module) is None:
        return None
    return importlib.import_module(module)


class _PowerWatts(BaseObserver):
    """Fills ``PipelineStats.watts`` from a power sampler (the budget controller's, or one of our own).

    Reads the sampler's one-second moving average every few frames, from the pipeline's progress.
    """

    def __init__(self, sampler: Any, rail: str | None, count_frames: bool) -> None:
        self.sampler = sampler
        self.rail = rail
        self.count_frames = count_frames

    def on_frame(self, stats: Any) -> None:
        if self.count_frames:
            self.sampler.frame_done()
        if stats.frames % 10 == 1:
            watts = self.sampler.moving_average(1.0, self.rail)
            if watts is not None:
                stats.watts = float(watts)


class _PowerHooks:
    """What the power package adds to a run: the budget's admission hook, live watts, a power summary."""

    def __init__(self, config: Any) -> None:
        self.admit: Callable[[], None] | None = None
        self.observers: list[Any] = []
        self._controller: Any = None
        self._sampler: Any = None
        power = _optional("edgert.power")
        if config.power.budget_w is not None:
            make = getattr(power, "budget_admission", None) if power is not None else None
            if make is None:
                from edgert.errors import ConfigError

                raise ConfigError("--power-budget: the power budget controller is not available in this edgert")
            self._controller = make(config.power)
            self.admit = self._controller.admit
            self.observers.append(_PowerWatts(self._controller.sampler, config.power.rail, count_frames=False))
            return
        # No budget: still show watts when this machine has a meter (INA3221 on a Jetson, NVML, RAPL).
        meters = _optional("edgert.power.meters")
        sampler_mod = _optional("edgert.power.sampler")
        if meters is None or sampler_mod is None:
            return
        from edgert.errors import EdgertError

        try:
            meter = meters.open_meter(config.power.meter)
            if not meter.available:
                return
            self._sampler = sampler_mod.PowerSampler(meter, hz=config.power.sample_hz).start()
        except EdgertError as exc:
            log.info("no power readings: %s", exc)
            return
        self.observers.append(_PowerWatts(self._sampler, config.power.rail, count_frames=True))

    def summary(self) -> dict[str, Any] | None:
        if self._controller is not None:
            return dict(self._controller.stats())
        if self._sampler is not None:
            return dict(self._sampler.summary())
        return None

    def close(self) -> None:
        if self._controller is not None:
            self._controller.close()
        if self._sampler is not None:
            self._sampler.stop()


def _service_observers(args: argparse.Namespace) -> tuple[list[Any], list[Callable[[], None]]]:
    from edgert.errors import ConfigError

    observers: list[Any] = []
    closers: list[Callable[[], None]] = []
    watchdog = _optional("edgert.service.watchdog")
    if watchdog is not None and hasattr(watchdog, "SystemdObserver"):
        observer = watchdog.SystemdObserver.from_env()
        if observer is not None:
            observers.append(observer)
    if args.metrics:
        metrics = _optional("edgert.service.metrics")
        if metrics is None:
            raise ConfigError("--metrics: the metrics endpoint is not available in this edgert")
        host, port = metrics.parse_listen(args.metrics)
        observer = metrics.MetricsObserver(pipeline=args.config or args.model or "")
        server = metrics.MetricsServer(host, port, observer.render)
        observers.append(observer)
        closers.append(server.close)
        print(f"edgert: metrics at {server.url}", file=sys.stderr)
    return observers, closers


# --------------------------------------------------------------------------------------------------


def _speech(config: Any, args: argparse.Namespace) -> int:
    from edgert.errors import ConfigError

    if getattr(args, "report", None):
        raise ConfigError(f"--report: detection runs only, not task {config.task}")
    speech = _optional("edgert.speech")
    cli_run = getattr(speech, "cli_run", None) if speech is not None else None
    if cli_run is None:
        raise ConfigError(f"task {config.task}: speech pipelines are not available in this edgert")
    return int(cli_run(config, args))


def format_summary(summary: dict[str, Any]) -> str:
    """The human-readable summary ``edgert run`` and ``edgert demo`` print."""
    lat = summary.get("latency_ms", {})
    src = summary.get("source") or {}
    rate = f", {float(src['fps']):g} fps" if src.get("fps") else ""
    lines = [
        f"model      {summary.get('model')} ({summary.get('backend')})",
        f"source     {src.get('uri')} ({src.get('width')}x{src.get('height')}{rate})",
        f"frames     {summary.get('frames')} at {summary.get('fps')} fps ({summary.get('stopped_by')})",
    ]
    for stage in ("capture", "preprocess", "infer", "postprocess", "sinks", "total"):
        q = lat.get(stage)
        if q:
            lines.append(f"  {stage:<11} p50 {q['p50']:8.2f} ms  p95 {q['p95']:8.2f} ms  p99 {q['p99']:8.2f} ms")
    drops = summary.get("drops") or {}
    lines.append(f"dropped    {summary.get('dropped', 0)}" + (f" ({', '.join(f'{k}: {v}' for k, v in drops.items())})"
                                                             if drops else ""))
    per_class = summary.get("detections_per_class") or {}
    top = ", ".join(f"{name} {n}" for name, n in list(per_class.items())[:8])
    lines.append(f"detections {summary.get('detections', 0)}" + (f" ({top})" if top else ""))
    if summary.get("watts") is not None:
        lines.append(f"power      {summary['watts']} W")
    if summary.get("sinks"):
        lines.append(f"sinks      {', '.join(summary['sinks'])}")
    return "\n".join(lines)


class _Progress(BaseObserver):
    """A tqdm bar on stderr (only when stderr is a terminal), fed from the pipeline's progress."""

    def __init__(self, total: int | None) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit="frame", file=sys.stderr, dynamic_ncols=True, leave=False)
        self._last = 0

    def on_frame(self, stats: Any) -> None:
        if stats.frames - self._last >= 10:
            self._bar.update(stats.frames - self._last)
            self._last = stats.frames
            self._bar.set_postfix_str(f"{stats.fps:.1f} fps", refresh=False)

    def on_stop(self, summary: dict[str, Any]) -> None:
        self._bar.close()


def execute(config: Any, args: argparse.Namespace, extra_observers: list[Any] | None = None) -> dict[str, Any]:
    """Run the detection pipeline for ``config`` with the CLI's hooks; return the summary."""
    from edgert.errors import ConfigError
    from edgert.pipeline import Pipeline

    if not config.model.path:
        raise ConfigError("no model given. Note: pass --model PATH or set model.path in the config")
    if not config.source.uri:
        raise ConfigError("no source given. Note: pass --source URI or set source.uri in the config")
    power = _PowerHooks(config)
    closers: list[Callable[[], None]] = [power.close]
    try:
        service_observers, service_closers = _service_observers(args)
        closers += service_closers
        observers = power.observers + service_observers + list(extra_observers or [])
        if sys.stderr.isatty() and not getattr(args, "json", False):
            observers.append(_Progress(config.runtime.max_frames))
        report = None
        if getattr(args, "report", None):
            from edgert.report.html import attach_report

            report = attach_report(observers, args.report, config.power.budget_w, config.power.rail)
        pipeline = Pipeline(config, observers=observers, admit=power.admit)
        _announce_web_previews(config)
        summary = pipeline.run()
        power_summary = power.summary()
        if power_summary is not None:
            summary["power"] = power_summary
        if report is not None:
            report.write(summary)  # again, now with the power summary (on_stop wrote it without)
            print(f"edgert: report written to {report.path}", file=sys.stderr)
        return summary
    finally:
        for close in closers:
            close()


def _announce_web_previews(config: Any) -> None:
    for uri in config.sinks:
        if uri.startswith("http://"):
            print(f"edgert: web preview at {uri.rstrip('/')}/ (when the pipeline has started)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    if config.task in SPEECH_TASKS:
        return _speech(config, args)
    summary = _execute_gpu(config, args) if getattr(args, "gpu_pipeline", False) else execute(config, args)
    # With jsonl://- the events own stdout; the summary then goes to stderr.
    out = sys.stderr if _stdout_is_a_sink(config) else sys.stdout
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary), file=out)
    return 0


def _execute_gpu(config: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``--gpu-pipeline``: edgert.pipeline.gpu_run (preprocess + filter on the GPU, overlapped slots)."""
    from edgert.errors import ConfigError
    from edgert.pipeline.gpu import GpuPipelineOptions
    from edgert.pipeline.gpu_run import run_gpu_pipeline

    if not config.model.path:
        raise ConfigError("no model given. Note: pass --model PATH or set model.path in the config")
    if getattr(args, "report", None):
        raise ConfigError("--report: not available with --gpu-pipeline yet")
    backend = config.model.backend if config.model.backend != "auto" else "onnxruntime-cuda"
    options = GpuPipelineOptions(memory=args.memory, slots=args.slots, cuda_graph=args.cuda_graph, backend=backend)
    return run_gpu_pipeline(config, options, preload=args.preload)


def _stdout_is_a_sink(config: Any) -> bool:
    return any(s.strip() == "jsonl://-" for s in config.sinks)
