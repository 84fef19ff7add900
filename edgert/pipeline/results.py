"""The result path of a whole batch, on the results thread: every frame in order, the statistics per batch.

Why per batch: on a GPU the engine takes a batch of 16 small frames in a few milliseconds, and every Python call
the pipeline makes per frame is serialised by the interpreter lock with the slot threads that feed the engine
(docs/pipeline.md). So what can be done for the batch at once is: the latency statistics (rings, and
every source's histogram in one array, in a few numpy calls: :meth:`~edgert.stats.PipelineStats.record_latencies`),
the detections per class (one ``bincount``), the drop counters (once per 10 frames of each source) and handing
the frames of worker-decoded files back to the collector (one call), the observers when every one of them takes
a batch (``on_frames``, :mod:`edgert.pipeline.observer`; the run's own power and telemetry observers do). What
stays per frame is what is per frame by nature: its source's result stages (tracking, lines, zones, in the
source's order) and sinks (skipped without a call where it has none; a frame with neither reads no clock of its
own), the frame counter, its source's figures, and ``on_frame`` for observers that see every count
(``stats.frames % n`` tests). About 20 Python calls a frame (44 before; ``docs/results/README.md: host calls``).

The decoding tail (one NMS and one mapping per batch) stays on the slot threads: moved here
(:meth:`~edgert.pipeline.gpu_slot.GpuSlot.process_deferred` returns it as a call), NanoDet at 16 streams fell from
2 988 to 2 371 frames/s on the H200 (docs/results/history-pipeline.md): OpenCV's NMS releases the interpreter lock,
so three slot threads run it side by side, where one results thread runs it in turn.

Order and accounting are :func:`edgert.pipeline.finish.finish`'s, frame by frame: the same steps, the same
statistics, the same observers' calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgert.pipeline.finish import apply_stages, emit, record_source, update_drops
from edgert.pipeline.observer import needs_every_frame
from edgert.stats import STAGES

if TYPE_CHECKING:
    from edgert.pipeline.feeds import _Batch, _Feed, _Frame
    from edgert.pipeline.state import RunState
    from edgert.vision.detections import Detections

__all__ = ["finish_batch"]

_SINKS, _TOTAL = STAGES.index("sinks"), STAGES.index("total")


def finish_batch(run: RunState, b: _Batch) -> None:
    """Every frame of ``b``, in order: result stages and sinks, then the batch's statistics, then each frame's
    count, its source's figures and the observers; the frames back to their sources (the collector's in one
    hand-over)."""
    frames = b.frames
    feeds = run.feeds
    tracking = run.tracking
    done: list[tuple[_Frame, _Feed, Detections, int, list[dict[str, object]], float]] = []
    t0 = time.perf_counter()
    staged = tracking.apply(frames, run.aborting) if tracking is not None else None  # track.workers: one trip
    share = (time.perf_counter() - t0) / len(frames) if staged is not None and frames else 0.0
    t1 = time.perf_counter() - share  # the sinks' stage includes the stages, as in-process
    now = t1
    for i, f in enumerate(frames):
        feed = feeds[f.feed]
        worked = True  # a stage or a sink ran for it: its own clock reading, else the last one's
        if staged is not None:
            detections, events = staged[i]
        elif feed.stages:
            detections, events = apply_stages(run, feed, f)
        else:  # no stages (the usual many-stream run): apply_stages's steps without its calls
            found = f.detections
            if found is None:
                detections, events = apply_stages(run, feed, f)  # says what went wrong
            else:
                own = getattr(found, "events", None)  # a speech result's
                detections, events = found, (_tagged(run, feed, own) if own else [])
                worked = False
        if f.notes:  # the run's own events about this frame (the first on a new model), once
            events = [*events, *_tagged(run, feed, f.notes)]
            f.notes = None
        if run.shared or feed.workers:
            emit(run, feed, f, detections, events)
            worked = True
        if worked:
            now = time.perf_counter()
        timings = f.timings
        timings[_SINKS] = now - t1
        timings[_TOTAL] = now - f.started
        done.append((f, feed, detections, len(detections), events, now))
        t1 = now - share  # the next frame's stages start here
    stats = run.stats
    before = stats.frames
    stats.record_latencies(np.array([f.timings for f in frames]), [feed.name for _, feed, _, _, _, _ in done])
    _count_classes(run.class_counts, [d.class_id for _, _, d, count, _, _ in done if count])
    give_back: Callable[[Sequence[_Frame]], None] | None = None
    back: list[_Frame] = []
    notify = run.notify
    observers = run.observers
    per_frame = any(needs_every_frame(o) for o in observers)  # an observer that needs every count
    for f, feed, _, count, events, now in done:
        stats.count_frame(count, feed.name, events, now)
        record_source(run, feed, f, count, now)  # drop counters: once per batch, below
        f.detections = None
        if feed.give_back is None:
            feed.free.put(f)
        else:  # one collector reads every collected source
            give_back = feed.give_back
            back.append(f)
        if per_frame:
            if not run.started:
                run.started = True
                notify("on_start", dict(run.info))
            notify("on_frame", stats)
    if not per_frame:  # every observer takes the batch in one call (edgert.pipeline.observer)
        if not run.started:
            run.started = True
            notify("on_start", dict(run.info))
        if observers:
            notify("on_frames", stats)
    if give_back is not None:
        give_back(back)  # the collector reads these sources' next frames into them: one hand-over per batch
    every = 10 * len(feeds)  # the drop counters walk every source and sink: about once per 10 frames of each
    if before // every != stats.frames // every or before == 0:
        update_drops(run)


def _tagged(run: RunState, feed: _Feed, own: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """A frame's own events, tagged with its source in a run of several, as :func:`apply_stages` has them."""
    events = list(own)
    if len(run.feeds) > 1:
        for event in events:
            event["source"] = feed.name
    return events


def _count_classes(counts: dict[int, int], ids: Sequence[np.ndarray]) -> None:
    """Detections per class of a batch (``ids``: the class ids of each frame that found any) in one bincount."""
    if not ids:
        return
    values = np.concatenate(ids).astype(np.int64)
    low = int(values.min())
    found = np.bincount(values - low)
    for k in np.flatnonzero(found).tolist():
        cid = k + low
        counts[cid] = counts.get(cid, 0) + int(found[k])
