"""Opening a run's sources: one that cannot open among several drops out, as it would later.

A camera down at boot must not keep every other camera down (with a service's start limit it would keep
them down for good): the run starts with the sources that open, reports the others the way it reports a
source that fails mid-run (``ended: error`` with its message, in the summary and the log), and fails only
when none opens, naming each. A live source has already retried with its backoff for ``source.timeout_s``
inside its own ``open``; when others opened, it goes on reconnecting in the background with the backoff of a
stream lost mid-run (``reconnecting`` in the summary and ``edgert_source_reconnecting`` in the metrics; its
first connection counts as a reconnect), and once it is up its frames flow like the others', its lines and
zones resolved on its first frame (:func:`late_stages`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from edgert.errors import ConfigError, EdgertError, SourceError
from edgert.redact import redact

if TYPE_CHECKING:
    from edgert.analytics.workers import TrackingWorkers
    from edgert.config import PipelineConfig, SourceConfig
    from edgert.io.sinks import SinkWorker
    from edgert.pipeline.feeds import _Feed
    from edgert.pipeline.parts import PipelineSource
    from edgert.pipeline.processor import Processor
    from edgert.pipeline.state import RunState
    from edgert.vision.detector import Detector

__all__ = ["close_order", "enter_sources", "late_stages", "make_feeds", "make_stages", "mark_reconnecting",
           "open_feeds", "open_pipeline_source"]

log = logging.getLogger(__name__)


def enter_sources(feeds: Sequence[_Feed], stack: contextlib.ExitStack[bool | None],
                  stopped: Callable[[], bool] | None = None) -> None:
    """Open each feed's source into ``stack``; a failure marks that feed (``error``, ended), several failures
    of all of them are one :class:`SourceError`. With one source its error is the run's, unchanged."""
    failed: list[_Feed] = []
    for feed in feeds:
        if stopped is not None and stopped():
            return  # a signal while starting: the run ends before any sink opens
        try:
            stack.enter_context(feed.source)
        except EdgertError as exc:
            if stopped is not None and stopped():
                return  # the stop interrupted its retries: not a failure of the source
            if len(feeds) == 1:
                raise
            feed.error = redact(exc)
            feed.end_reason = "error"
            feed.ended = True
            failed.append(feed)
            continue
        feed.opened = True
    if failed and len(failed) == len(feeds):
        raise SourceError("no source could be opened: " + "; ".join(f"{f.name}: {f.error}" for f in failed))
    for feed in failed:
        later = getattr(feed.source, "open_in_background", None)
        if later is None:
            log.error("source %s did not open: %s; the run goes on with the %d other(s)", feed.name, feed.error,
                      len(feeds) - len(failed))
            continue
        # A camera that boots slower than the others: retried like one lost mid-run, reported as reconnecting.
        feed.start_error, feed.error, feed.end_reason, feed.ended = feed.error, None, "end of input", False
        stack.callback(feed.source.close)
        later()
        feed.opened = True
        log.error("source %s did not open: %s; reconnecting it in the background, the run goes on with the %d "
                  "other(s)", feed.name, feed.start_error, len(feeds) - len(failed))


def ask_sources_to_stop(feeds: Sequence[_Feed]) -> None:
    """Tell every capture worker to stop before the first source is closed: the closes then join workers that
    are already on their way out, so N workers stuck in a camera's connect cost one grace period, not N."""
    for feed in feeds:
        ask = getattr(feed.source, "ask_to_stop", None)  # capture workers; in-process sources have none
        if ask is not None:
            ask()


def make_stages(run: RunState) -> None:
    """Each opened source's tracking and analytics stages, its lines and zones checked on its own frame size."""
    if run.config.track is not None or run.config.analytics.enabled:
        from edgert.analytics.stages import make_result_stages

        for feed in run.feeds:  # each source its own tracks and counts, its lines checked on its frame
            if not feed.opened or feed.start_error is not None:
                continue  # no frame yet to check its lines on (a late one gets them on its first: late_stages)
            size = (int(getattr(feed.source, "width", 0) or 0), int(getattr(feed.source, "height", 0) or 0))
            feed.stages = make_result_stages(run.config, feed.source.fps, size, run.names, feed.name)


def start_tracking(run: RunState) -> TrackingWorkers | None:
    """The run's tracking workers (``track.workers`` or the default), each opened source's stages handed to
    one; None when tracking stays on the results thread."""
    from edgert.analytics.workers import TrackingWorkers, tracking_worker_count

    staged = [feed for feed in run.feeds if feed.stages]
    count = tracking_worker_count(run.config, len(run.feeds))
    if count == 0 or not staged:
        return None
    workers = TrackingWorkers(run.config, run.names, count, len(run.feeds))
    for feed in staged:
        size = (int(getattr(feed.source, "width", 0) or 0), int(getattr(feed.source, "height", 0) or 0))
        feed.stages = workers.adopt(feed.index, feed.name, feed.source.fps, size, feed.stages)
    log.info("tracking in %d worker process(es) for %d sources", count, len(run.feeds))
    return workers


def late_stages(run: RunState, feed: _Feed) -> bool:
    """Give ``feed``, a source that came up after the start, its tracking and analytics stages, its lines and
    zones resolved on its own frame size; False (the feed ends with the error) when they do not fit it."""
    if feed.start_error is None or feed.stages or not (run.config.track is not None or run.config.analytics.enabled):
        return True
    from edgert.analytics.stages import make_result_stages

    size = (int(feed.source.width or 0), int(feed.source.height or 0))
    try:
        feed.stages = make_result_stages(run.config, feed.source.fps, size, run.names, feed.name)
        if run.tracking is not None:  # track.workers: its worker makes them again on its first frame
            feed.stages = run.tracking.adopt(feed.index, feed.name, feed.source.fps, size, feed.stages)
    except EdgertError as exc:
        feed.error, feed.end_reason = redact(exc), "error"
        log.error("source %s dropped out: %s; the other sources go on", feed.name, feed.error)
        return False
    return True


def mark_reconnecting(run: RunState) -> None:
    """Put ``reconnecting`` in the per-source figures the metrics read, for each source now reconnecting
    (a source that delivers writes its figures afresh, without it)."""
    down = [feed for feed in run.feeds if getattr(feed.source, "reconnecting", False)]
    if not down:
        return
    sources = dict(run.stats.sources)
    for feed in down:
        figures = dict(sources.get(feed.name) or {"frames": 0, "fps": 0.0, "dropped": 0})
        figures.update(reconnecting=1, reconnects=int(getattr(feed.source, "reconnects", 0)))
        sources[feed.name] = figures
    run.stats.sources = sources


def open_feeds(feeds: Sequence[_Feed]) -> list[_Feed]:
    """The feeds whose source opened (all of them when none was marked)."""
    return [feed for feed in feeds if feed.opened]


def close_order(workers: Sequence[SinkWorker]) -> list[SinkWorker]:
    """Sink workers in the order to close them: those that may wait on the network first (so a second signal
    abandons them), the lossless file sinks last (so they are finalised even then)."""
    return sorted(workers, key=lambda worker: bool(getattr(worker.sink, "lossless", False)))


def make_feeds(config: PipelineConfig, given: Sequence[PipelineSource] = ()) -> list[_Feed]:
    """A feed per source: the sources a caller gave (opened by it), else those of ``config``, opened here."""
    from edgert.pipeline.feeds import _Feed

    if given:
        return [_Feed(i, str(i), src) for i, src in enumerate(given)]
    configs = config.all_sources()
    feeds = []
    for i, cfg in enumerate(configs):
        if not cfg.uri:
            raise ConfigError("no source given. Note: pass --source URI or set source.uri in the config")
        name = cfg.name if cfg.name is not None else str(i)
        feeds.append(_Feed(i, name, open_pipeline_source(cfg, len(configs), config.runtime.max_frames), cfg))
    return feeds


def open_pipeline_source(cfg: SourceConfig, count: int = 1, max_frames: int | None = None) -> PipelineSource:
    """The source of ``cfg`` as the pipeline reads it: captured in this process or a worker process, or
    decoded into memory first (``source.preload``)."""
    from edgert.io.sources import open_source

    if not cfg.preload:
        from edgert.io.capture import open_captured

        return open_captured(cfg, count)  # source.capture: this process's thread, or a worker process
    from edgert.io.capture import choose_capture
    from edgert.pipeline.preload import PreloadedSource

    choose_capture(cfg.capture, count, preload=True)  # capture: process cannot apply: refused in one line
    if cfg.realtime:
        raise ConfigError("source.realtime cannot apply to a preloaded source (its frames are in memory, "
                          "timed by nothing). Note: drop --preload or --realtime")
    # The file itself is read once; looping happens over the frames in memory.
    inner = open_source(dataclasses.replace(cfg, loop=False, preload=False))
    return PreloadedSource(inner, max_frames if not cfg.loop else None, loop=cfg.loop)


def open_run_processor(state: RunState, config: PipelineConfig, detector: Detector | None,
                       owns: bool) -> tuple[PipelineConfig, Processor, bool]:
    """(config, processor, whether the run owns it): the processor given, or the one the config asks for. Where
    ``model.update_dir`` is set, a restart opens the last good model (update_state) and the processor is wrapped
    for model updates on the running pipeline (a door thread, a wrapper the run owns; it closes the given
    processor only if that one was the run's)."""
    from edgert.pipeline.choice import open_processor

    if state.processor is None:
        if config.model.update_dir:
            from edgert.pipeline.update_state import start_config

            config = state.config = start_config(config)
        state.processor = open_processor(config, detector=detector, batch=None, sources=len(state.feeds))
    if config.model.update_dir:
        from edgert.pipeline.update_door import open_updates

        state.processor = open_updates(state, state.processor, owns)
        owns = True
    return config, state.processor, owns
