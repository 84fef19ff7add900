"""``edgert run``: a model on a source, into sinks, until the input ends or a signal stops it.

One YAML file (``--config``) can describe everything (task, model, preprocess, decode, source, sinks,
runtime, power); flags override it. ``--json`` prints the final summary as JSON on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Any

from edgert.pipeline.observer import BaseObserver

log = logging.getLogger(__name__)

SPEECH_TASKS = ("vad", "wakeword", "asr")  # edgert.speech.stages.SPEECH_TASKS (the parser must not import speech)


def register(subparsers: Any) -> None:
    from edgert.io.sinks import sink_help
    from edgert.io.sources import source_help

    p = subparsers.add_parser(
        "run", help="run a detector on a video, images, camera or stream into sinks",
        description=f"Run a model on a source ({source_help()}) into sinks ({sink_help()}). "
                    "Flags override the --config YAML.",
    )
    add_run_arguments(p)
    p.set_defaults(func=run)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="ONNX model or engine (overrides model.path)")
    p.add_argument("--config", help="pipeline YAML (task, model, preprocess, decode, source, sinks, runtime, power)")
    p.add_argument("--source", action="append", default=None, metavar="URI",
                   help="input URI (overrides source.uri); repeat it for several sources in one pipeline")
    p.add_argument("--sink", action="append", default=None, metavar="URI",
                   help="output URI, repeatable (replaces the config's sinks)")
    p.add_argument("--task", choices=["detect", *SPEECH_TASKS], help="override the config's task")
    p.add_argument("--max-frames", type=int, metavar="N", help="stop after N frames")
    from edgert.backends import backend_names

    p.add_argument("--backend", help=f"{', '.join(['auto', *backend_names()])} (overrides model.backend)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for the backend (0: its default)")
    p.add_argument("--conf", type=float, metavar="X", help="confidence threshold (decode.conf)")
    p.add_argument("--iou", type=float, metavar="X", help="NMS IoU threshold (decode.iou)")
    p.add_argument("--classes", metavar="NAME[,NAME]",
                   help="keep only these classes, by name or id (person,car or 0,2; decode.classes)")
    p.add_argument("--loop", action="store_true", help="restart a video or image folder at its end")
    p.add_argument("--realtime", action="store_true",
                   help="deliver a video file at its own frame rate, as a camera would (source.realtime)")
    p.add_argument("--stagger", action="store_true",
                   help="with --realtime, spread the sources over one frame interval (source i comes i/N of it "
                        "late), as unsynchronized cameras do (source.realtime_phase)")
    p.add_argument("--queue-size", type=int, metavar="N", help="frames in flight between stages (runtime.queue_size)")
    p.add_argument("--power-budget", type=parse_watts, metavar="WATTS",
                   help="pace the pipeline to stay under WATTS (10 or 10W)")
    p.add_argument("--rail", help="power rail the budget applies to (power.rail)")
    p.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics at HOST:PORT/metrics")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON on stdout")
    p.add_argument("--track", nargs="?", const="bytetrack", default=None, metavar="TRACKER",
                   help="track objects across frames (bytetrack by default; sort, ocsort): a track_id per box")
    p.add_argument("--track-workers", type=int, default=None, metavar="N",
                   help="processes that track groups of sources (track.workers; 0: on the results thread; default: "
                        "one per 4 sources from 8 sources on a machine of 4 cores or more)")
    p.add_argument("--line", action="append", default=None, metavar="NAME:x1,y1,x2,y2[:in|out|both]",
                   help="a counting line (repeatable; pixels or 0..1 fractions; :classes=A,B filters classes; "
                        "needs --track; added to the config's analytics.lines)")
    p.add_argument("--zone", action="append", default=None, metavar="NAME:x1,y1,x2,y2,x3,y3,...",
                   help="a zone (repeatable; :crowded_at=N emits zone_crowded/zone_clear; :classes=A,B; "
                        "needs --track; added to analytics.zones)")
    p.add_argument("--report", metavar="PATH.html",
                   help="write an HTML page with FPS, latency and watts over time and the summary at the end")
    g = p.add_argument_group("processing (runtime.processing, runtime.slots ...; docs/pipeline.md)")
    g.add_argument("--processing", choices=["auto", "cpu", "gpu"],
                   help="cpu: host preprocessing and decoding; gpu: letterbox kernel and the confidence filter on "
                        "the GPU; auto (default): gpu whenever the backend runs on a GPU and CUDA works")
    g.add_argument("--gpu-pipeline", action="store_true", help="the same as --processing gpu")
    g.add_argument("--slots", type=int, metavar="N",
                   help="batches processed at once, each on its own session (CPU 2; GPU 3, 4 from batch 8 if fast)")
    g.add_argument("--memory", choices=["auto", "pinned", "zero-copy"],
                   help="GPU processing: frame memory, zero-copy (mapped, Jetson) or pinned copies; auto by device")
    g.add_argument("--cuda-graph", action="store_true", default=None,
                   help="GPU processing: replay the model as a CUDA graph (ORT enable_cuda_graph)")
    g.add_argument("--fixed-batch", action="store_true",
                   help="GPU processing: run every engine call at the full batch (runtime.part_batches: false; "
                        "default: a part batch runs at the smallest of 1, 2, 4, ... that holds it)")
    g.add_argument("--batch", type=int, metavar="N",
                   help="frames per engine call across sources (runtime.batch; default: one per source on the GPU, "
                        "1 on the CPU)")
    g.add_argument("--batch-timeout-ms", type=float, metavar="MS",
                   help="how long a batch waits for slower sources while another is in flight "
                        "(runtime.batch_timeout_ms, default 10)")
    g.add_argument("--preload", action="store_true",
                   help="decode the whole file source into memory before the clock starts (benchmarks)")
    g.add_argument("--capture", choices=["auto", "thread", "process"],
                   help="how sources are decoded (source.capture): thread (in this process), process (a worker "
                        "process per source into a shared frame ring), auto (default: process from 4 sources on "
                        "4+ cores)")
    from edgert.cli.speech_flags import add_asr_arguments

    add_asr_arguments(p)


def parse_watts(text: str) -> float:
    """``10``, ``10W``, ``7.5 w`` -> watts (argparse type: a bad value is a usage error naming it)."""
    value = text.strip()
    if value[-1:] in ("W", "w"):
        value = value[:-1].strip()
    try:
        watts = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected watts such as 10 or 10W, got {text!r}") from None
    if not watts > 0:
        raise argparse.ArgumentTypeError(f"expected watts > 0, got {text!r}")
    return watts


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
    from edgert.cli.task_flags import refuse_flags

    refuse_flags(args.task or config.task, args)
    for name in ("max_frames", "threads", "queue_size", "slots", "batch"):
        value = getattr(args, name, None)
        if value is not None and value < 0:
            raise ConfigError(f"--{name.replace('_', '-')}: expected a number >= 0, got {value}")
    model = _replace(config.model, {"threads": "--threads", "path": "--model", "backend": "--backend"},
                     path=args.model, backend=args.backend, threads=args.threads)
    decode = _replace(config.decode, {"conf": "--conf", "iou": "--iou"}, conf=args.conf, iou=args.iou)
    if getattr(args, "classes", None):
        from edgert.cli.class_flag import class_ids, model_class_names

        decode = dataclasses.replace(decode, classes=class_ids(args.classes, model_class_names(model.path,
                                                                                              decode.names)))
    uris = list(args.source or [])
    loop = True if args.loop else None
    preload = True if getattr(args, "preload", False) else None
    realtime = True if getattr(args, "realtime", False) else None
    source, sources = config.source, config.sources
    if len(uris) > 1 or (uris and sources):  # several sources: each takes the config's source settings
        base = sources[0] if sources else config.source
        sources = tuple(dataclasses.replace(base, uri=u, name=None, sinks=()) for u in uris) if uris else sources
        source = dataclasses.replace(config.source, uri="")
    elif uris:
        source = _replace(source, {}, uri=uris[0])
    capture = getattr(args, "capture", None)
    per_source = {"loop": loop, "preload": preload, "capture": capture, "realtime": realtime}
    source = _replace(source, {}, **per_source) if source.uri else source
    sources = tuple(_replace(s, {}, **per_source) for s in sources)
    if getattr(args, "stagger", False):
        if len(sources) < 2:
            raise ConfigError("--stagger: one source has no other to be out of step with. Note: give several --source")
        if not all(s.realtime for s in sources):
            raise ConfigError("--stagger: spreads sources delivered at their own rate only. Note: add --realtime")
        sources = tuple(dataclasses.replace(s, realtime_phase=i / len(sources)) for i, s in enumerate(sources))
    processing = getattr(args, "processing", None)
    if getattr(args, "gpu_pipeline", False):
        if processing not in (None, "gpu"):
            raise ConfigError(f"--gpu-pipeline means --processing gpu; it contradicts --processing {processing}")
        processing = "gpu"
    runtime = _replace(config.runtime, {"queue_size": "--queue-size", "max_frames": "--max-frames", "slots": "--slots",
                                        "metrics": "--metrics"},
                       max_frames=args.max_frames, queue_size=args.queue_size, processing=processing,
                       slots=getattr(args, "slots", None), memory=getattr(args, "memory", None),
                       cuda_graph=getattr(args, "cuda_graph", None), metrics=getattr(args, "metrics", None),
                       part_batches=False if getattr(args, "fixed_batch", False) else None,
                       batch=getattr(args, "batch", None), batch_timeout_ms=getattr(args, "batch_timeout_ms", None))
    power = _replace(config.power, {"budget_w": "--power-budget", "rail": "--rail"},
                     budget_w=args.power_budget, rail=args.rail)
    sinks = tuple(args.sink) if args.sink is not None else None
    track = config.track
    if getattr(args, "track", None):
        from edgert.config import TrackConfig

        track = _replace(track or TrackConfig(), {"tracker": "--track"}, tracker=args.track)
    if getattr(args, "track_workers", None) is not None:
        if track is None:
            from edgert.errors import ConfigError

            raise ConfigError("--track-workers: nothing to track. Note: add --track (or a track section)")
        track = _replace(track, {"workers": "--track-workers"}, workers=args.track_workers)
    analytics = config.analytics
    if getattr(args, "line", None) or getattr(args, "zone", None):
        from edgert.analytics.rules import with_rules

        analytics = with_rules(analytics, args.line or (), args.zone or ())
    config = _replace(config, {}, task=args.task, model=model, decode=decode, source=source, sources=sources,
                      runtime=runtime, power=power, sinks=sinks, track=track, analytics=analytics)
    from edgert.cli.speech_flags import apply_asr_flags

    return apply_asr_flags(config, args)


# --------------------------------------------------------------------------------------------------


def format_summary(summary: dict[str, Any]) -> str:
    """The human-readable summary ``edgert run`` and ``edgert demo`` print."""
    lat = summary.get("latency_ms", {})
    src = summary.get("source") or {}
    rate = f", {float(src['fps']):g} fps" if src.get("fps") else ""
    batch = f", batch {summary['batch']}" if (summary.get("batch") or 1) > 1 else ""
    lines = [
        f"model      {summary.get('model')} ({summary.get('backend')}, {summary.get('processing')} processing, "
        f"{summary.get('slots')} slots{batch})",
    ]
    sources = summary.get("sources") or []
    if len(sources) > 1:
        for one in sources:
            drops = sum((one.get("drops") or {}).values())
            extra = f", {one['error']}" if one.get("error") else ""
            lines.append(f"source     {one.get('name')}: {one.get('uri')}: {one.get('frames')} frames at "
                         f"{one.get('fps')} fps, {drops} dropped, {one.get('reconnects', 0)} reconnects "
                         f"({one.get('ended')}{extra})")
    elif src.get("sample_rate"):  # audio: chunks of samples, not frames of pixels
        lines.append(f"source     {src.get('uri')} (audio, {src['sample_rate']} Hz, {src.get('chunk_samples')}-sample "
                     f"chunks)")
    else:
        lines.append(f"source     {src.get('uri')} ({src.get('width')}x{src.get('height')}{rate})")
    speech = summary.get("speech")
    unit = "chunks" if speech else "frames"
    if summary.get("frames") == 1 and not speech:  # one image: a rate means nothing
        lines.append(f"{unit:<10} 1 ({summary.get('stopped_by')})")
    else:
        lines.append(f"{unit:<10} {summary.get('frames')} at {summary.get('fps')} fps ({summary.get('stopped_by')})")
    if speech:
        from edgert.cli.task_flags import speech_lines

        lines += speech_lines(speech)
    if summary.get("batch_note"):
        lines.append(f"batching   {summary['batch_note']}")
    for stage in ("capture", "preprocess", "infer", "postprocess", "sinks", "total"):
        q = lat.get(stage)
        if q:
            lines.append(f"  {stage:<11} p50 {q['p50']:8.2f} ms  p95 {q['p95']:8.2f} ms  p99 {q['p99']:8.2f} ms")
    drops = summary.get("drops") or {}
    lines.append(f"dropped    {summary.get('dropped', 0)}" + (f" ({', '.join(f'{k}: {v}' for k, v in drops.items())})"
                                                             if drops else ""))
    undecodable = summary.get("undecodable") or {}
    if undecodable:  # a damaged file's frames: not drops, the file lacked them
        reasons = ", ".join(f"{k}: {v}" for k, v in undecodable.items())
        lines.append(f"undecodable {sum(undecodable.values())} ({reasons})")
    per_class = summary.get("detections_per_class") or {}
    top = ", ".join(f"{name} {n}" for name, n in list(per_class.items())[:8])
    limits = summary.get("thresholds") or {}
    at = f" at conf {limits['conf']:g}, iou {limits['iou']:g}" if limits and not speech else ""
    lines.append(f"detections {summary.get('detections', 0)}{at}" + (f" ({top})" if top else ""))
    lines.extend(count_lines(summary))
    skipped = summary.get("skipped") or {}
    if skipped:
        lines.append("skipped    " + ", ".join(f"{k}: {v}" for k, v in skipped.items())
                     + " (a slow viewer; the pipeline lost nothing)")
    gpu = summary.get("gpu_ms") or {}
    if gpu:
        lines.append("  gpu        " + "  ".join(f"{k} {v['p50']:.2f}" for k, v in gpu.items()) + " ms (p50)")
    if summary.get("watts") is not None:
        energy = f", {summary['mj_per_frame']:.1f} mJ/frame" if summary.get("mj_per_frame") is not None else ""
        lines.append(f"power      {summary['watts']:.2f} W{energy}")
    notes = summary.get("sink_notes") or {}
    for i, uri in enumerate(summary.get("sinks") or ()):  # one per line: a video's line names its codec
        lines.append(("sinks      " if i == 0 else " " * 11) + (f"{uri}: {notes[uri]}" if uri in notes else str(uri)))
    return "\n".join(lines)


def count_lines(summary: dict[str, Any]) -> list[str]:
    """The summary's line and zone counts (``counts``), one text line per line or zone (per source)."""
    counts = summary.get("counts") or {}
    per_source = summary.get("sources") or []
    # several sources: {source: {line or zone: ...}}; one: {line or zone: ...}
    scoped = [(f"{name}: ", c or {}) for name, c in counts.items()] if len(per_source) > 1 else [("", counts)]
    out = []
    for prefix, table in scoped:
        for name, by_class in table.items():
            if not by_class:
                out.append(f"count      {prefix}{name}: nothing counted")
                continue
            first = next(iter(by_class.values()))
            if "occupancy" in first:
                text = "; ".join(f"{c} {int(v['occupancy'])} now, {v['entered']} entered, {v['exited']} exited"
                                 for c, v in by_class.items())
                out.append(f"zone       {prefix}{name}: {text}")
            else:
                text = "; ".join(f"{c} {v.get('in', 0)} in, {v.get('out', 0)} out" for c, v in by_class.items())
                out.append(f"line       {prefix}{name}: {text}")
    tracking = summary.get("tracking")
    if isinstance(tracking, dict) and "tracks" in tracking:
        out.append(f"tracks     {tracking['tracks']} ({tracking.get('tracker')})")
    return out


def nothing_saved_note(config: Any) -> str | None:
    """The one line ``edgert run`` prints when no sink saves anything: a run without ``--sink`` writes nothing."""
    if config.sinks or any(s.sinks for s in config.all_sources()):
        return None
    return ("edgert: no sink given, so nothing was saved. Note: add --sink out.mp4 (annotated video), "
            "--sink jsonl://events.jsonl (detections) or --sink frames/ (annotated images)")


class _Progress(BaseObserver):
    """Frames done, on stderr (:class:`~edgert.cli.progress.Progress`: a bar on a terminal, a few lines otherwise),
    with the total when the sources know it (files, folders). Made at the start, when the sources are open."""

    def __init__(self, label: str = "run") -> None:
        self._label = label
        self._progress: Any = None
        self._last = 0

    def on_start(self, info: dict[str, Any]) -> None:
        from edgert.cli.progress import Progress

        total = info.get("expected_frames")
        if total == 1 or (total is None and not sys.stderr.isatty()):
            return  # one image: nothing to wait for; a camera in a log (a service): no end to count towards
        self._progress = Progress(self._label, total, unit="frame")

    def on_frame(self, stats: Any) -> None:
        if self._progress is not None and stats.frames - self._last >= 10:
            self._progress.update(stats.frames - self._last, f"{stats.fps:.1f} fps")
            self._last = stats.frames

    on_frames = on_frame  # by the count's difference: a batch at once is the same

    def on_stop(self, summary: dict[str, Any]) -> None:
        if self._progress is not None:
            frames = summary.get("frames")
            if isinstance(frames, int) and frames > self._last:
                self._progress.update(frames - self._last)
            self._progress.close()


def execute(config: Any, args: argparse.Namespace, extra_observers: list[Any] | None = None) -> dict[str, Any]:
    """Run the detection pipeline for ``config`` (what ``edgert run`` and ``edgert demo`` share); the summary.

    Everything else a run needs (the power budget and meter, systemd notifications, the metrics endpoint)
    the pipeline opens itself from the config and the environment; the CLI adds only a progress bar.
    """
    from edgert.errors import ConfigError
    from edgert.pipeline import Pipeline

    if not config.model.path and config.task not in SPEECH_TASKS:  # speech stages may name theirs in speech.*
        raise ConfigError("no model given. Note: pass --model PATH or set model.path in the config")
    if not config.source.uri and not config.sources:
        raise ConfigError("no source given. Note: pass --source URI or set source.uri in the config")
    from edgert.redact_stderr import redact_fd2_for

    redact_fd2_for(s.uri for s in config.all_sources())  # OpenCV/FFmpeg/GStreamer write to fd 2 past logging
    observers = list(extra_observers or [])
    report = None
    if getattr(args, "report", None):
        from edgert.report.html import attach_report

        report = attach_report(observers, args.report, config.power.budget_w, config.power.rail)
    observers.append(_AnnouncePreviews())
    if not getattr(args, "json", False):
        observers.append(_Progress(getattr(args, "progress_label", "run")))
    summary: dict[str, Any] = Pipeline(config, observers=observers).run()
    if report is not None:
        print(f"edgert: report written to {report.path}", file=sys.stderr)
    return summary


class _AnnouncePreviews(BaseObserver):
    """Prints each web preview's address once the pipeline runs (its port is bound by then, not before)."""

    def on_start(self, info: dict[str, Any]) -> None:
        if info.get("metrics"):  # bound by now, with its real port
            print(f"edgert: metrics at {info['metrics']}", file=sys.stderr, flush=True)
        for uri in info.get("sinks", ()):
            if str(uri).startswith("http://"):
                print(f"edgert: web preview at {str(uri).rstrip('/')}/", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    summary = execute(config, args)
    # With jsonl://- the events own stdout; the summary then goes to stderr.
    out = sys.stderr if _stdout_is_a_sink(config) else sys.stdout
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary), file=out)
    note = nothing_saved_note(config)
    if note:
        print(note, file=sys.stderr)
    return 0


def _stdout_is_a_sink(config: Any) -> bool:
    return any(s.strip() == "jsonl://-" for s in config.sinks)
