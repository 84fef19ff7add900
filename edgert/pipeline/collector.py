"""One capture thread for every file source decoded by a worker process: one wake per batch, not one per frame.

Why: with a thread per source, each of 16 streams' frames woke its own thread twice (a free frame, then the
worker's message) and cost about 90 Python calls and five system calls in the pipeline's process, every one of
them waiting for the interpreter lock beside the slot threads that feed the engine. Measured on the H200 at 16
NanoDet streams (docs/pipeline.md), the capture threads were the largest user of that lock (0.36 of
a core); the slot threads' postprocess step, which reacquires it a few times per batch, took 8 ms of wall time
for about 2 ms of work. The collector polls every worker's pipe and one pipe the workers share for their frames
(:mod:`edgert.io.capture.hub`) in one call, reads the shared pipe once per wake (every worker's frames) and a
worker's own pipe only when it says something else (a frame larger than its slot, the end, an error, its death),
gets the frames the results thread finished in one hand-over per batch (:meth:`Collector.give_back`), gives a
worker its slots back two at a time, and tells the batcher once per wake; per frame only its record's unpickling
and a few attribute stores remain (about 30 Python calls and 0.8 pipe system calls a frame at 16 streams, where a
thread per source made about 88 and five: ``docs/results/README.md: host calls``, docs/pipeline.md).

What stays per source is what :meth:`~edgert.pipeline.runner.Pipeline._capture` does: ``max_frames``, the order,
a failing source dropping out (the run's failure when it is the only one), its end reason, and its first
frame's late stages. Live sources keep their own thread (their worker drops frames and the pipeline keeps the
newest, :meth:`~edgert.io.capture.process.ProcessCaptureSource.read`), and so does every source of a run
paced by a power budget (``admit`` blocks per frame).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgert.errors import EdgertError
from edgert.stats import STAGES

if TYPE_CHECKING:
    from edgert.pipeline.feeds import _Feed, _Frame
    from edgert.pipeline.state import RunState

__all__ = ["Collector", "collects"]

log = logging.getLogger(__name__)

_POLL_MS = 100  # how long a wait lasts before it checks for a stop or an abort (the capture threads' 0.1 s)
_CAPTURE = STAGES.index("capture")
#: Freed ring slots a worker gets back in one message (fewer writes); a slot alone waits for the next one while
#: another of its source's frames is out. The ring has READ_AHEAD (3) slots beyond the pipeline's frames, so the
#: worker still decodes ahead meanwhile.
_GIVE_BACK_AT = 2


def collects(feed: _Feed, paced: bool) -> bool:
    """Whether the collector reads ``feed``: an opened file source decoded by a worker, in a run not paced per frame."""
    source = feed.source
    return (not paced and feed.opened and callable(getattr(source, "take", None))
            and not getattr(source, "live", False))


class Collector:
    """Reads ``feeds`` (all :func:`collects`) on one thread: :meth:`run`. ``cv`` is the batcher's condition.

    Per wake, not per frame: one ``poll`` for every pipe, one read of the shared pipe (the hub), one read of each
    own pipe that has something (:meth:`~edgert.io.capture.process.ProcessCaptureSource.pull`: rare), one
    message to each worker with two slots back (or its last), one lock for the frames the results thread gave back
    (:meth:`give_back`, once per batch) and one for the batcher. Per frame only what is the frame's own: its
    message unpickled, its slot's view, its stamps.
    """

    def __init__(self, state: RunState, feeds: Sequence[_Feed], cv: threading.Condition, limit: int | None) -> None:
        self.state = state
        self.feeds = list(feeds)
        self.cv = cv
        self.limit = limit
        # The results thread writes a byte here when frames come back (once per batch): the wait ends at once.
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._lock = threading.Lock()
        self._back: list[_Frame] = []  # given back, not yet sorted to their sources (under _lock)
        self._open = True  # run() still sorts them (under _lock); after it, they go to the free lists at once
        self._held: dict[int, list[int]] = {feed.index: [] for feed in self.feeds}  # freed slots not yet sent
        self._frames: dict[int, int] = {feed.index: 0 for feed in self.feeds}  # each source's frames (run())
        # A file's media time as edgert.io.sources.media_time has it (a worker sends no frame times): its
        # index over its rate, fixed once the source is open.
        self._rates = {feed.index: float(getattr(feed.source, "fps", None) or 30.0) for feed in self.feeds}
        for feed in self.feeds:
            feed.give_back = self.give_back
        # One pipe for every worker's frames (edgert.io.capture.hub): one read per wake, not one per source.
        from edgert.io.capture.hub import MessageHub

        self._hub: MessageHub | None = MessageHub()
        joined = [feed.source.join_hub(self._hub, feed.index) for feed in self.feeds  # type: ignore[attr-defined]
                  if callable(getattr(feed.source, "join_hub", None))]
        self._hub.close_writer()  # the workers hold it now: the hub reads EOF when the last of them is gone
        if not any(joined):
            self._hub.close()
            self._hub = None

    def give_back(self, frames: Sequence[_Frame]) -> None:
        """Finished frames of collected feeds (the results thread's, once per batch): this thread's next images."""
        with self._lock:
            if self._open:
                self._back += frames
                frames = ()
        for f in frames:  # the collector is done: where a capture thread's frames wait
            self.state.feeds[f.feed].free.put(f)
        self.wake()

    def wake(self) -> None:
        # A full pipe has a wake pending already, and a closed one (the end) wants none: nothing to add either way.
        with contextlib.suppress(OSError):
            os.write(self._w, b"\0")

    def close(self) -> None:
        for feed in self.feeds:
            feed.give_back = None
        if self._hub is not None:  # a worker still writing to it ends (EPIPE) as if told to stop
            self._hub.close()
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):  # closed already: close is safe to call twice
                os.close(fd)

    def run(self) -> None:
        stop, abort = self.state.stopping, self.state.aborting
        active = {feed.index: feed for feed in self.feeds}
        idle: dict[int, list[_Frame]] = {feed.index: [] for feed in self.feeds}
        paused: dict[int, int] = {}  # feeds whose source wants no reading for now: their fd, off the poll
        touched: set[int] = set(active)  # feeds that got messages or frames back since they were last matched
        try:
            by_fd = {feed.source.fileno(): feed for feed in self.feeds}  # type: ignore[attr-defined]
            poller = select.poll()
            poller.register(self._r, select.POLLIN)
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            hub = self._hub
            hub_fd = -1 if hub is None else hub.fileno()
            if hub is not None:
                poller.register(hub_fd, select.POLLIN)
            for feed in self.feeds:  # the frames allocate_frames put on the free lists
                while feed.free.qsize():
                    idle[feed.index].append(feed.free.get_nowait())
                self._frames[feed.index] = len(idle[feed.index])
            while active and not stop.is_set():
                self._sort_back(active, idle, touched)
                got: list[_Frame] = []
                ended: list[_Feed] = []
                t0, now = time.perf_counter(), time.time()  # the wake's: its frames were all there by then
                for index in touched:
                    reading = active.get(index)
                    if reading is not None and not self._match(reading, idle[index], got, t0, now):
                        ended.append(reading)
                touched.clear()
                for feed in ended:
                    del active[feed.index]
                    fd = paused.pop(feed.index, None)
                    if fd is None:
                        fd = next(fd for fd, g in by_fd.items() if g is feed)
                        poller.unregister(fd)
                    del by_fd[fd]
                    self._end(feed, idle)
                for index, fd in list(paused.items()):  # take() made room: read its pipe again
                    if active[index].source.wants_pull:  # type: ignore[attr-defined]
                        del paused[index]
                        poller.register(fd, select.POLLIN)
                if got or ended:
                    with self.cv:
                        feeds = self.state.feeds
                        for f in got:
                            feeds[f.feed].pending.append(f)
                        self.cv.notify_all()
                if not active or stop.is_set():
                    break
                ready = poller.poll(_POLL_MS)
                if abort.is_set():
                    return
                read_hub = False
                for fd, _ in ready:
                    if fd == self._r:
                        self._drain()
                        continue
                    read_hub = True  # the hub after the own pipes: every frame sent before what they said
                    if fd == hub_fd:
                        continue
                    feed = by_fd[fd]
                    touched.add(feed.index)
                    if not feed.source.pull():  # type: ignore[attr-defined]
                        paused[feed.index] = fd
                        poller.unregister(fd)
                if read_hub and hub is not None:
                    touched.update(hub.read())
                    if hub.ended:  # every worker gone: an ended pipe stays readable, off the poll
                        poller.unregister(hub_fd)
                        hub = None
        finally:
            for feed in active.values():
                self._end(feed, idle)
            with self._lock:
                self._open = False
                back, self._back = self._back, []
            for f in back:
                self.state.feeds[f.feed].free.put(f)

    def _sort_back(self, active: dict[int, _Feed], idle: dict[int, list[_Frame]], touched: set[int]) -> None:
        """Frames the results thread gave back: kept for their sources' next images (their slots back to the
        workers, one message per source once it has :data:`_GIVE_BACK_AT` of them), or on the free list of a
        source that ended."""
        with self._lock:
            back, self._back = self._back, []
        if not back:
            return
        for f in back:
            idle[f.feed].append(f)
        held = self._held
        for index in {f.feed for f in back}:
            frames = idle[index]
            feed = active.get(index)
            if feed is None:  # ended: its frames wait on its free list, as a capture thread's do
                for f in frames:
                    self.state.feeds[index].free.put(f)
                frames.clear()
                continue
            touched.add(index)
            slots = held[index]
            for f in frames:
                if f.lent >= 0:
                    slots.append(f.lent)
                    f.lent = -1  # the worker's again (the frame's pixels still view it until its next image)
            # One write per source per batch was ~0.75 system calls a frame at 16 streams: a slot waits for the
            # next one, unless none of the source's frames is out (nothing else would come back to join it).
            if slots and (len(slots) >= _GIVE_BACK_AT or len(frames) >= self._frames[index]):
                feed.source.give_back(slots)  # type: ignore[attr-defined]
                held[index] = []

    def _match(self, feed: _Feed, idle: list[_Frame], got: list[_Frame], t0: float, now: float) -> bool:
        """``feed``'s frames that arrived, into its idle frames, onto ``got``; False when the feed is done (ended,
        failed, its limit). ``t0`` / ``now``: the wake's clocks (``perf_counter``, ``time``), its frames' start
        and timestamp."""
        index = feed.done_reading
        most = len(idle)
        if self.limit is not None:
            if index >= self.limit:
                feed.end_reason = "max_frames"
                return False
            if most > self.limit - index:
                most = self.limit - index
        source = feed.source
        taken, outcome = source.take(most)  # type: ignore[attr-defined]
        if taken:
            capture = time.perf_counter() - t0
            rate = self._rates[feed.index]
            for pixels, slot, current in taken:
                f = idle.pop()
                f.pixels = pixels  # the ring's slot (or the array that came through the pipe): the frame's until back
                f.lent = slot
                f.started = t0
                f.timestamp = now
                f.media_time = index / rate
                f.index = index
                f.meta = None  # a worker sends pixels and the file they came from (a frame's meta: audio chunks')
                f.file = current
                f.timings[_CAPTURE] = capture
                if index == 0:
                    from edgert.pipeline.startup import late_stages

                    if not late_stages(self.state, feed):
                        idle.append(f)
                        feed.done_reading = index
                        return False
                    self.state.stats.mark_started()
                index += 1
                got.append(f)
            feed.done_reading = index
        if self.limit is not None and index >= self.limit:  # what came after its last frame is not read
            feed.end_reason = "max_frames"
            return False
        if outcome is None:
            return True
        if isinstance(outcome, EdgertError):
            if len(self.state.feeds) == 1:
                raise outcome  # the run's only source: its failure is the run's
            feed.error = str(outcome)
            feed.end_reason = "error"
            log.error("source %s dropped out: %s; the other sources go on", feed.name, outcome)
            return False
        reason = getattr(source, "end_reason", None)
        if reason:
            feed.end_reason = str(reason)
        return False

    def _end(self, feed: _Feed, idle: dict[int, list[_Frame]]) -> None:
        """``feed`` reads no more: its idle frames back on its free list (what the stop deadline counts), ended."""
        for f in idle[feed.index]:
            feed.free.put(f)
        idle[feed.index].clear()
        if self.state.stopping.is_set() and feed.end_reason == "end of input":
            feed.end_reason = "stopped"
        with self.cv:
            feed.ended = True
            self.cv.notify_all()

    def _drain(self) -> None:
        """Empty the wake pipe: the wakes since the last poll are one wake. One read: a byte per batch since the
        last poll is far below 64 KiB (were there more, the pipe stays readable and the next poll reads on)."""
        with contextlib.suppress(OSError):  # BlockingIOError: empty after all (it is non-blocking)
            os.read(self._r, 65536)
