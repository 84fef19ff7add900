"""``edgert run``: a model on a source, into sinks, until the input ends or a signal stops it.

One YAML file (``--config``) can describe everything (task, model, preprocess, decode, source, sinks,
runtime, power); flags override it. ``--json`` prints the final summary as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from edgert.cli.run_flags import add_run_flags, apply_flags, parse_watts
from edgert.config import PipelineConfig, load_config
from edgert.jsonl_uri import writes_stdout
from edgert.pipeline.observer import BaseObserver
from edgert.tasks import SPEECH_TASKS

log = logging.getLogger(__name__)

__all__ = ["add_run_arguments", "build_config", "execute", "format_summary", "parse_watts", "register", "run"]



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
    """The flags of ``edgert run``: the rows of :data:`edgert.cli.run_flags.RUN_FLAGS`."""
    add_run_flags(p)


def build_config(args: argparse.Namespace) -> Any:
    """The pipeline config from ``--config`` (or defaults) with every given flag applied."""
    return apply_flags(load_config(args.config) if args.config else PipelineConfig(), args)


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


def speech_lines(speech: dict[str, Any]) -> list[str]:
    """The speech part of the text summary: the chain, events, real-time factors, Whisper's share, what was cut."""
    lines = [
        f"chain      {' -> '.join(speech['chain'])} ({speech['audio_seconds']} s of audio)",
        f"events     {speech['segments']} segments, {speech['wake_events']} wake words, "
        f"{speech['transcripts']} transcripts",
        f"rtf        {speech['rtf']} (busy seconds per second of audio; wall {speech['wall_rtf']})",
    ]
    for name, st in speech["stages"].items():
        lines.append(f"  {name:<9} {st['calls']:6d} calls  {st['seconds']:8.3f} s  rtf {st['rtf']}")
    if "asr" in speech["stages"]:
        lines.append(f"whisper    ran on {speech['whisper_audio_seconds']} s = "
                     f"{100 * speech['whisper_share']:.1f}% of the audio")
    budget = speech.get("budget")
    if budget:
        lines.append(f"budget     {budget['windows_narrowed']} windows narrowed to greedy, {budget['windows_shed']} "
                     f"shed ({budget['audio_shed_s']} s of audio)")
    cut = speech.get("cut") or {}
    if any(cut.values()):
        lines.append(f"cut        {cut.get('open_segment_s', 0)} s of an open segment, "
                     f"{cut.get('untranscribed_s', 0)} s waiting for Whisper, {cut.get('queued_segments', 0)} queued "
                     "segments")
    return lines


def count_lines(summary: dict[str, Any]) -> list[str]:
    """The summary's rule counts (``counts``), one text line per line, zone ... (per source)."""
    counts = summary.get("counts") or {}
    per_source = summary.get("sources") or []
    # several sources: {source: {line or zone: ...}}; one: {line or zone: ...}
    scoped = [(f"{name}: ", c or {}) for name, c in counts.items()] if len(per_source) > 1 else [("", counts)]
    out = []
    if any(table for _, table in scoped):
        from edgert.analytics.table import kind_of  # each rule's row words its counts

        for prefix, table in scoped:
            for name, by_class in table.items():
                row = kind_of(by_class)
                if row is None:
                    out.append(f"count      {prefix}{name}: nothing counted")
                else:
                    out.append(f"{row.kind:<10} {prefix}{name}: {row.text(by_class)}")
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
    return any(writes_stdout(s) for s in config.sinks)
