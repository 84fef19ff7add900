"""The run's summary: what ``edgert run --json`` prints and :meth:`Pipeline.run` returns, built from the run's
figures (stats, per-source feeds, sink workers, the processor), the same for both processors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from edgert.pipeline.feeds import _Feed, expected_frames, time_base
from edgert.redact import redact

if TYPE_CHECKING:
    from edgert.config import PipelineConfig
    from edgert.io.sinks import SinkWorker
    from edgert.pipeline.parts import JSONDict
    from edgert.pipeline.processor import Processor
    from edgert.pipeline.state import RunState
    from edgert.stats import PipelineStats


def undecodable_totals(feeds: Sequence[_Feed]) -> dict[str, int]:
    """Every source's undecodable frames by reason (counted apart from ``drops``: they never existed)."""
    totals: dict[str, int] = {}
    for feed in feeds:
        for reason, n in feed.undecodable().items():
            totals[reason] = totals.get(reason, 0) + n
    return totals


def run_time_base(feeds: Sequence[_Feed]) -> str | dict[str, str]:
    """What the analytics' times are: one word for the run, or one per source when they differ."""
    bases = {feed.name: time_base(feed.source) for feed in feeds}
    return next(iter(bases.values())) if len(set(bases.values())) == 1 else bases


def run_summary(*, config: PipelineConfig, stats: PipelineStats, info: Mapping[str, object],
                processor: Processor | None, feeds: Sequence[_Feed], workers: Sequence[SinkWorker],
                names: Sequence[str], class_counts: dict[int, int], frames_in_flight: int, stopped_by: str,
                errors: Sequence[BaseException], wall_s: float | None = None,
                batches: int | None = None) -> JSONDict:
    """The summary of a run (see :meth:`edgert.pipeline.runner.Pipeline.summary`): frames, FPS, per-stage latency,
    drops by reason, detections per class, why it stopped, per-source figures; the GPU processor adds
    ``gpu_ms``."""
    per_class = {
        (names[cid] if 0 <= cid < len(names) else str(cid)): n
        for cid, n in sorted(class_counts.items(), key=lambda kv: -kv[1])
    }
    summary: JSONDict = {
        "model": config.model.path,
        "backend": info.get("backend"),
        "processing": getattr(processor, "kind", None),
        "processor": processor.describe() if processor is not None else None,
        "source": feeds[0].source.info() if len(feeds) == 1 else None,
        "sources": [feed.summary() for feed in feeds],
        "sinks": [redact(w.sink.uri) for w in workers],
        "frames": stats.frames,
        "fps": round(stats.average_fps, 2),
        "latency_ms": stats.latency_ms(),
        "dropped": stats.dropped,
        "drops": dict(stats.drops),
        "undecodable": undecodable_totals(feeds),
        "reconnects": sum(int(getattr(feed.source, "reconnects", 0)) for feed in feeds),
        "detections": stats.detections,
        "detections_per_class": per_class,
        # what decided which boxes count, so two runs' numbers can be compared
        "thresholds": {"conf": config.decode.conf, "iou": config.decode.iou, "max_det": config.decode.max_det},
        "stopped_by": stopped_by,
        "time_base": run_time_base(feeds),
        "slots": len(processor.slots) if processor is not None else 0,
        "batch": getattr(processor, "batch", 1),
        "frames_in_flight": frames_in_flight,
        # engine calls, and how full they ran: a part batch costs a whole batch's compute on a fixed-shape engine
        "batches": batches,
        "batch_fill": round(stats.frames / (batches * getattr(processor, "batch", 1)), 3) if batches else None,
        "tracking_workers": info.get("tracking_workers", 0),  # processes tracking groups of sources (track.workers)
        "watts": None if stats.watts is None else round(float(stats.watts), 3),
        "mj_per_frame": None,
    }
    staged = [feed for feed in feeds if feed.stages]
    if len(staged) == 1 and len(feeds) == 1:
        from edgert.analytics.stages import stages_summary

        summary.update(stages_summary(staged[0].stages))
    elif staged:
        summary["counts"] = {feed.name: feed.summary().get("counts") for feed in staged}
    skipped = {f"sink:{redact(w.sink.uri)}": int(w.dropped) for w in workers
               if w.sink.skips_frames and w.dropped}
    if skipped:
        summary["skipped"] = skipped  # frames a slow viewer skipped by design, not in dropped
    notes = {redact(w.sink.uri): w.sink.note for w in workers if w.sink.note}
    if notes:
        summary["sink_notes"] = notes  # what a sink wrote, e.g. a video's codec (a fallback says so)
    lost = {redact(w.sink.uri): w.lost for w in workers if getattr(w, "lost", 0)}
    if lost:
        summary["lost"] = lost  # frames a failed sink did not write
    note = getattr(processor, "batch_note", None)
    if note:
        summary["batch_note"] = note
    gpu = processor.stage_summary() if processor is not None else None
    if gpu is not None:
        summary["gpu_ms"] = gpu
    if wall_s is not None:
        summary["wall_s"] = round(wall_s, 3)
    speech = processor.speech_summary() if processor is not None else None
    if speech is not None:
        summary["task"] = config.task
        summary["speech"] = speech
    if errors:
        summary["error"] = redact(errors[0])
    return summary


def start_info(config: PipelineConfig, state: RunState, processor: Processor, stats: PipelineStats,
               frames_in_flight: int, hooks: object) -> dict[str, object]:
    """What observers' ``on_start`` get: the model, its input, the sources, sinks, slots and batch."""
    first = state.feeds[0].source
    return {
        "task": config.task,
        "model": config.model.path,
        "backend": processor.backend_name,
        "processing": processor.kind,
        "input": {"name": processor.input_name, "shape": list(processor.input_shape),
                  "dtype": processor.input_dtype},
        "classes": len(state.names),
        "source": first.uri if len(state.feeds) == 1 else [f.source.uri for f in state.feeds],
        "source_info": first.info(),
        "sources": [f.name for f in state.feeds],
        "stats": stats,  # the live PipelineStats, for observers that read it later (metrics)
        "sinks": [redact(w.sink.uri) for w in state.workers],
        "slots": len(processor.slots),
        "tracking_workers": state.tracking.count if state.tracking is not None else 0,
        "batch": processor.batch,
        "frames_in_flight": frames_in_flight,
        "metrics": getattr(hooks, "metrics_url", None),  # its real port (":0" asks for any)
        "expected_frames": expected_frames(state.feeds, config.runtime.max_frames),
    }
