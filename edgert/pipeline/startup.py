"""Opening a run's sources: one that cannot open among several drops out, as it would later.

A camera down at boot must not keep every other camera down (with a service's start limit it would keep
them down for good): the run starts with the sources that open, reports the others the way it reports a
source that fails mid-run (``ended: error`` with its message, in the summary and the log), and fails only
when none opens, naming each. A live source has already retried with its backoff for ``source.timeout_s``
inside its own ``open``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from edgert.errors import EdgertError, SourceError
from edgert.redact import redact

if TYPE_CHECKING:
    from edgert.pipeline.feeds import _Feed
    from edgert.vision.sinks import SinkWorker

__all__ = ["close_order", "enter_sources", "open_feeds"]

log = logging.getLogger("edgert.pipeline.runner")


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
        log.error("source %s did not open: %s; the run goes on with the %d other(s)", feed.name, feed.error,
                  len(feeds) - len(failed))


def open_feeds(feeds: Sequence[_Feed]) -> list[_Feed]:
    """The feeds whose source opened (all of them when none was marked)."""
    return [feed for feed in feeds if feed.opened]


def close_order(workers: Sequence[SinkWorker]) -> list[SinkWorker]:
    """Sink workers in the order to close them: those that may wait on the network first (so a second signal
    abandons them), the lossless file sinks last (so they are finalised even then)."""
    return sorted(workers, key=lambda worker: bool(getattr(worker.sink, "lossless", False)))
