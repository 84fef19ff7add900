"""The last step of every frame, on the results thread: its result stages, drawing, the sinks, the statistics.

Apart from :mod:`edgert.pipeline.runner` because it is what happens to *one* frame once its detections are
back in order, written as named steps (:func:`finish` calls them in turn), while the runner moves frames between
threads. The steps take the run's shared state (:class:`~edgert.pipeline.state.RunState`), not the pipeline.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from edgert.redact import redact
from edgert.stats import STAGES

if TYPE_CHECKING:
    import numpy as np

    from edgert.pipeline.feeds import _Feed, _Frame
    from edgert.pipeline.speech_result import SpeechResult
    from edgert.pipeline.state import RunState
    from edgert.vision.detections import Detections

__all__ = ["apply_stages", "emit", "finish", "finish_tail", "record_source", "update_drops"]

_SINKS, _TOTAL = STAGES.index("sinks"), STAGES.index("total")


def finish(run: RunState, f: _Frame) -> None:
    """One frame, in order: result stages, drawing and the sinks, then statistics; its buffer is free again."""
    feed = run.feeds[f.feed]
    t1 = time.perf_counter()
    detections, events = apply_stages(run, feed, f)
    emit(run, feed, f, detections, events)
    done = time.perf_counter()
    f.timings[_SINKS] = done - t1
    f.timings[_TOTAL] = done - f.started
    _record(run, feed, f, detections, events, done)
    f.detections = None
    if feed.give_back is not None:  # the collector's: it reads the source's next frame into it
        feed.give_back((f,))
    else:
        feed.free.put(f)
    if not run.started:
        run.started = True
        run.notify("on_start", dict(run.info))
    run.notify("on_frame", run.stats)


def apply_stages(run: RunState, feed: _Feed, f: _Frame) -> tuple[Detections, list[dict[str, object]]]:
    """The frame's detections and events after its source's result stages (tracking, lines, zones)."""
    detections = f.detections
    if detections is None:  # the slot hands every frame back with its detections
        raise RuntimeError(f"frame {f.index} of source {feed.name} came back from its slot without detections")
    if run.tracking is not None and run.tracking.tracks(feed.index):  # track.workers: its frames go to its worker
        return run.tracking.apply([f], run.aborting)[0]
    events: list[dict[str, object]] = list(getattr(detections, "events", ()))  # speech: wake words, transcripts
    if feed.stages:
        from edgert.analytics.stages import run_stages

        detections, events = run_stages(feed.stages, detections, f.index, f.media_time)
    if len(run.feeds) > 1:
        for event in events:
            event["source"] = feed.name
    return detections, events


def emit(run: RunState, feed: _Feed, f: _Frame, detections: Detections, events: list[dict[str, object]]) -> None:
    """Draw the frame when a sink wants pixels, then offer its result to the shared sinks and its source's own."""
    from edgert.io.sinks import FrameResult

    workers = (*run.shared, *feed.workers) if feed.workers else run.shared
    if not workers:
        return
    draw = feed.draw and f.pixels is not None
    if draw and f.pixels is not None:
        _draw(run, feed, f.pixels, detections)
    result = FrameResult(f.index, f.timestamp, detections, f.pixels if draw else None, f.file, feed.name,
                         events, frame_record=getattr(detections, "frame_record", True))
    for worker in workers:
        worker.offer(result, abort=run.aborting)


def _draw(run: RunState, feed: _Feed, pixels: np.ndarray, detections: Detections) -> None:
    """Boxes, and with analytics the lines and zones as checked for this source (pixels) with their counts."""
    from edgert.analytics.table import draw_rules
    from edgert.vision.draw import draw_detections

    draw_detections(pixels, detections)
    if not run.config.analytics.enabled:
        return
    analytics = getattr(getattr(feed.stages[-1], "analytics", None), "config", None) if feed.stages else None
    analytics = analytics or run.config.analytics
    counts = feed.stages[-1].summary().get("counts") if feed.stages else None
    draw_rules(pixels, analytics, counts)


def _record(run: RunState, feed: _Feed, f: _Frame, detections: Detections, events: list[dict[str, object]],
            done: float) -> None:
    """The run's and the source's statistics for this frame; what readers poll is refreshed every 10th."""
    for cid in detections.class_id.tolist():
        run.class_counts[cid] = run.class_counts.get(cid, 0) + 1
    count = len(detections)
    run.stats.record_frame(f.timings, count, feed.name, events)
    if run.stats.frames % 10 == 1:  # drop counters walk every source and sink: not on every frame
        update_drops(run)
    record_source(run, feed, f, count, done)


def record_source(run: RunState, feed: _Feed, f: _Frame, count: int, done: float) -> None:
    """The source's own figures for one finished frame; what readers poll is refreshed every 10th frame."""
    feed.done += 1
    feed.detections += count
    if feed.first_done is None:
        feed.first_done = done
    feed.last_done = done
    feed.media_span = (f.media_time if feed.media_span is None else feed.media_span[0], f.media_time)
    if feed.done % 10 == 1:  # the metrics endpoint reads these; a fresh dict, so a reader never sees half of one
        run.stats.sources = {**run.stats.sources, feed.name: {
            "frames": feed.done, "fps": round(feed.fps(), 3), "dropped": sum(feed.drops().values()),
            "reconnects": int(getattr(feed.source, "reconnects", 0))}}
    if feed.stages and feed.done % 10 == 1:  # lines and zones of every source, labelled by it
        counts = feed.stages[-1].summary().get("counts")
        run.stats.analytics_by_source = {**run.stats.analytics_by_source, feed.name: counts}
        if feed.index == 0:
            run.stats.analytics_counts = counts


def finish_tail(run: RunState, feed: _Feed, result: SpeechResult) -> None:
    """Events a processor still held when the last frame was through, to the sinks: a result of no frame."""
    from edgert.io.sinks import FrameResult

    events = list(result.events)
    if not events:
        return
    if len(run.feeds) > 1:
        for event in events:
            event["source"] = feed.name
    tail = FrameResult(feed.done, time.time(), result, None, None, feed.name, events, frame_record=False)
    for worker in (*run.shared, *feed.workers):
        worker.offer(tail, abort=run.aborting)


def update_drops(run: RunState) -> None:
    """The drop counters of the run's statistics: every source's by reason, and each sink's that drops frames."""
    totals: dict[str, int] = {}
    for feed in run.feeds:
        for reason, n in feed.drops().items():
            if not reason.startswith("sink:"):
                totals[reason] = totals.get(reason, 0) + n
    for reason, n in totals.items():
        run.stats.set_drops(reason, n)
    for worker in run.workers:
        if worker.dropped and not worker.sink.skips_frames:  # a preview's skips are not drops: summary()
            run.stats.set_drops(f"sink:{redact(worker.sink.uri)}", worker.dropped)
    from edgert.pipeline.startup import mark_reconnecting

    mark_reconnecting(run)
