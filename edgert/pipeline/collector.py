"""One capture thread for every file source decoded by a worker process: one wake per batch, not one per frame.

Why: with a thread per source, each of 16 streams' frames woke its own thread twice (a free frame, then the
worker's message) and cost about 90 Python calls and five system calls in the pipeline's process, every one of
them waiting for the interpreter lock beside the slot threads that feed the engine. Measured on the H200 at 16
NanoDet streams (issue 28, docs/pipeline.md), the capture threads were the largest user of that lock (0.36 of
a core); the slot threads' postprocess step, which reacquires it a few times per batch, took 8 ms of wall time
for about 2 ms of work. The collector does a source's frame in one receive and a few attribute stores, polls
every worker's pipe in one call, gives each worker its slots back in one message per wake, and tells the
batcher once per wake.

What stays per source is what :meth:`~edgert.pipeline.runner.Pipeline._capture` does: ``max_frames``, the order,
a failing source dropping out (the run's failure when it is the only one), its end reason, and its first
frame's late stages. Live sources keep their own thread (their worker drops frames and the pipeline keeps the
newest, :meth:`~edgert.vision.capture.process.ProcessCaptureSource.read`), and so does every source of a run
paced by a power budget (``admit`` blocks per frame).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgert.errors import EdgertError

if TYPE_CHECKING:
    from edgert.pipeline.feeds import _Feed, _Frame
    from edgert.pipeline.state import RunState

__all__ = ["Collector", "collects"]

log = logging.getLogger(__name__)

_POLL_MS = 100  # how long a wait lasts before it checks for a stop or an abort (the capture threads' 0.1 s)


def collects(feed: _Feed, paced: bool) -> bool:
    """Whether the collector reads ``feed``: an opened file source decoded by a worker, in a run not paced per frame."""
    source = feed.source
    return (not paced and feed.opened and callable(getattr(source, "receive", None))
            and not getattr(source, "live", False))


class Collector:
    """Reads ``feeds`` (all :func:`collects`) on one thread: :meth:`run`. ``cv`` is the batcher's condition."""

    def __init__(self, state: RunState, feeds: Sequence[_Feed], cv: threading.Condition, limit: int | None) -> None:
        self.state = state
        self.feeds = list(feeds)
        self.cv = cv
        self.limit = limit
        # The results thread writes a byte here when frames come back (once per batch): the wait ends at once.
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        for feed in self.feeds:
            feed.wake = self.wake

    def wake(self) -> None:
        # A full pipe has a wake pending already, and a closed one (the end) wants none: nothing to add either way.
        with contextlib.suppress(OSError):
            os.write(self._w, b"\0")

    def close(self) -> None:
        for feed in self.feeds:
            feed.wake = None
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):  # closed already: close is safe to call twice
                os.close(fd)

    def run(self) -> None:
        stop, abort = self.state.stopping, self.state.aborting
        active = list(self.feeds)
        idle: dict[int, list[_Frame]] = {feed.index: [] for feed in active}
        by_fd = {feed.source.fileno(): feed for feed in active}  # type: ignore[attr-defined]
        try:
            while active and not stop.is_set():
                self._take_back(active, idle)
                poller = select.poll()
                poller.register(self._r, select.POLLIN)
                for fd, feed in by_fd.items():
                    if idle[feed.index]:
                        poller.register(fd, select.POLLIN)
                ready = poller.poll(_POLL_MS)
                if abort.is_set():
                    return
                got: list[_Frame] = []
                ended: list[_Feed] = []
                for fd, _ in ready:
                    if fd == self._r:
                        self._drain()
                        continue
                    feed = by_fd[fd]
                    if not idle[feed.index] or stop.is_set():
                        continue
                    f = self._one(feed, idle[feed.index])
                    if f is None:
                        ended.append(feed)
                    else:
                        got.append(f)
                if ended:
                    for feed in ended:
                        active.remove(feed)
                        by_fd = {fd: g for fd, g in by_fd.items() if g is not feed}
                        self._end(feed, idle[feed.index])
                if got or ended:
                    with self.cv:
                        for f in got:
                            self.state.feeds[f.feed].pending.append(f)
                        self.cv.notify_all()
        finally:
            for feed in active:
                self._end(feed, idle[feed.index])

    def _take_back(self, feeds: Sequence[_Feed], idle: dict[int, list[_Frame]]) -> None:
        """Frames the results thread gave back: kept for the next images, their slots back to the workers."""
        for feed in feeds:
            back = idle[feed.index]
            had = len(back)
            while True:
                try:
                    back.append(feed.free.get_nowait())
                except queue.Empty:
                    break
            if len(back) > had:
                feed.source.give_back([f.pixels for f in back[had:]])  # type: ignore[attr-defined]

    def _one(self, feed: _Feed, idle: list[_Frame]) -> _Frame | None:
        """The next frame of ``feed`` into one of its idle frames; None when the feed is done (ended, failed, limit)."""

        index = feed.done_reading
        if self.limit is not None and index >= self.limit:
            feed.end_reason = "max_frames"
            return None
        source = feed.source
        t0 = time.perf_counter()
        try:
            pixels = source.receive()  # type: ignore[attr-defined]
        except EdgertError as exc:
            if len(self.state.feeds) == 1:
                raise  # the run's only source: its failure is the run's
            feed.error = str(exc)
            feed.end_reason = "error"
            log.error("source %s dropped out: %s; the other sources go on", feed.name, exc)
            return None
        if pixels is None:
            reason = getattr(source, "end_reason", None)
            if reason:
                feed.end_reason = str(reason)
            return None
        f = idle.pop()
        f.pixels = pixels  # the ring's slot (or the array that came through the pipe): the frame's until it is back
        f.captured(source, index, t0)
        if index == 0:
            from edgert.pipeline.startup import late_stages

            if not late_stages(self.state, feed):
                idle.append(f)
                return None
            self.state.stats.mark_started()
        feed.done_reading = index + 1
        return f

    def _end(self, feed: _Feed, idle: list[_Frame]) -> None:
        """``feed`` reads no more: its idle frames back on its free list (what the stop deadline counts), ended."""
        for f in idle:
            feed.free.put(f)
        idle.clear()
        if self.state.stopping.is_set() and feed.end_reason == "end of input":
            feed.end_reason = "stopped"
        with self.cv:
            feed.ended = True
            self.cv.notify_all()

    def _drain(self) -> None:
        """Empty the wake pipe: the wakes since the last poll are one wake."""
        with contextlib.suppress(OSError):  # BlockingIOError: empty (it is non-blocking), drained
            while os.read(self._r, 4096):
                continue
