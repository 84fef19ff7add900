"""Opening a run's sinks: every sink checked, locked and bound before any truncates its file, then opened.

Apart from :mod:`edgert.pipeline.runner` because it is one idea of its own (which sink goes to which source,
what a sink that cannot apply is refused with, how a start that fails or is stopped releases what it claimed),
and it runs once, before the threads start. It takes the run's shared state (:class:`~edgert.pipeline.state.RunState`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from edgert.errors import ConfigError
from edgert.redact import redact

if TYPE_CHECKING:
    from edgert.io.sinks import Sink, SinkWorker
    from edgert.pipeline.feeds import _Feed
    from edgert.pipeline.parts import SinkSpec
    from edgert.pipeline.state import RunState

__all__ = ["open_sinks", "sink_title"]

log = logging.getLogger(__name__)


class _StoppedAtStart(Exception):
    """A stop was requested while the sinks were being prepared: none is opened (truncated)."""


def open_sinks(run: RunState) -> None:
    """Every sink checked, locked and bound before any truncates its file (a run that cannot start leaves
    existing outputs alone), then opened; a sink failing mid-run stops the run with its error."""
    from edgert.io.sinks import SinkWorker, StreamInfo, as_sink
    from edgert.io.sinks.plan import sink_plan
    from edgert.pipeline.startup import open_feeds

    feeds = run.feeds
    several = len(feeds) > 1
    live = open_feeds(feeds)  # a source that did not open gets no sinks: its outputs are left alone
    own = [feed.config.sinks if feed.config is not None else () for feed in live]
    plan: list[tuple[SinkSpec, _Feed | None]] = [  # (spec, the feed it is for; None: shared)
        (spec, None if i is None else live[i])
        for spec, i in sink_plan(run.sink_specs, [feed.name for feed in live], own)]
    prepared: list[tuple[Sink, _Feed | None]] = []

    def failed(worker: SinkWorker) -> None:
        if worker.error is not None:
            run.errors.append(worker.error)
        run.request_stop("sink failed")

    try:
        for spec, owner in plan:
            sink = as_sink(spec, sink_title(run, owner))
            prepared.append((sink, owner))
            if sink.needs_image and getattr(run.processor, "kind", "") == "speech":
                raise ConfigError(f"sink {sink.uri} draws frames; a speech task has none. Note: speech events "
                                  "go to jsonl://, mqtt:// or a callback")
            if owner is None and several and sink.needs_image and not sink.multi_source:
                raise ConfigError(f"sink {sink.uri} draws frames, and this run has {len(feeds)} sources. Note: "
                                  "give it a {source} placeholder (out-{source}.mp4) or list it under one "
                                  "source's sinks")
            sink.prepare()
        if run.stopping.is_set():  # a signal while starting: release what was claimed, truncate nothing
            raise _StoppedAtStart
        run.outputs_open = True
        for sink, owner in prepared:
            # The first source's size and rate for a shared sink; a multi-source one reads each frame's own.
            src = (owner or live[0]).source
            names = (owner.name,) if owner is not None else tuple(feed.name for feed in feeds)
            sink.open(StreamInfo(src.width, src.height, src.fps, run.names, sink_title(run, owner),
                                 run.stats, names))
            worker = SinkWorker(sink, on_failure=failed)
            worker.start()
            run.workers.append(worker)
            if owner is None:
                run.shared.append(worker)
            else:
                owner.workers.append(worker)
    except BaseException as failure:
        for worker in run.workers:
            worker.close()
        for sink, _ in prepared[len(run.workers):]:
            try:
                sink.close()
            except Exception as exc:  # releasing must not hide the error that stopped the start
                log.warning("sink %s did not release cleanly: %s", redact(sink.uri), exc)
        run.workers, run.shared = [], []
        for feed in feeds:
            feed.workers = []
        if isinstance(failure, _StoppedAtStart):
            return
        raise
    shared_draw = any(w.sink.needs_image for w in run.shared)
    for feed in feeds:
        feed.draw = shared_draw or any(w.sink.needs_image for w in feed.workers)


def sink_title(run: RunState, owner: _Feed | None) -> str:
    """What a sink calls the stream it gets (a window's title, a file's metadata): the model on its source(s)."""
    model = _basename(run.config.model.path)
    if owner is None and len(run.feeds) > 1:
        return f"{model} on {len(run.feeds)} sources"
    return f"{model} on {(owner or run.feeds[0]).source.uri}"


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1] or "model"
