"""A source decoded in its own process: the pipeline's capture thread only receives slot numbers.

:class:`ProcessCaptureSource` is a :class:`~edgert.io.sources.FrameSource` like any other to the
pipeline. Its worker (:mod:`edgert.io.capture.worker`) opens the real source (the same ``open_source`` as
the in-process capture, so the same decoder and the same pixels) and decodes into a shared ring
(:mod:`edgert.io.capture.ring`); ``read()`` hands back the slot the frame lies in, so the frame is never
copied in the main process. The slot is lent to the pipeline's frame until that frame comes back for its
next image (``read(out)`` with ``out`` the slot view): then it goes back to the worker.

A worker that dies (killed, crashed in a driver) closes its pipe. A live source's worker is started again
with the backoff of a lost stream (:class:`~edgert.io.capture.restart.WorkerRestarts`: ``reconnecting`` while
it comes back, counted in ``reconnects``); a file's worker is not (its frames would repeat), so ``read()`` raises
:class:`SourceError` naming the source and how the worker ended, and a run with several sources drops that one.

A live source still down at start fails :meth:`open` like any other, but its worker stays: when the run's other
sources opened, :mod:`edgert.pipeline.startup` calls :attr:`open_in_background` (as for the in-process
capture), the worker reconnects with the backoff of a stream lost mid-run, and ``reconnecting`` and
``reconnects`` follow what it reports. Its ring is made at its first frame, when its size is known (the
frames the pipeline asked for at :meth:`attach` are kept until then).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import os
import pickle
import select
import struct
import threading
import time
from typing import Any, Callable, NoReturn, Sequence

import numpy as np

from edgert.errors import SourceError, process_ended
from edgert.io.capture.hub import MessageHub
from edgert.io.capture.restart import WorkerRestarts
from edgert.io.capture.ring import FrameRing, slot_bytes_for
from edgert.io.sources import FrameSource
from edgert.redact import redact

__all__ = ["READ_AHEAD", "ProcessCaptureSource"]

log = logging.getLogger(__name__)

#: Slots beyond the pipeline's own frames, so the worker decodes ahead while every frame is in flight.
READ_AHEAD = 3
#: Slots when no pipeline said how many frames it keeps (the source used on its own).
DEFAULT_FRAMES = 4
_OPEN_TIMEOUT_S = 60.0  # spawning + importing OpenCV + opening the source (an RTSP connect can take 10 s)
_POLL_S = 0.1
#: How long a worker told to stop has to exit before it is killed (stuck in a camera's connect, a driver call).
CLOSE_GRACE_S = 2.0
_PULL_BYTES = 1 << 20  # one read of the pipe: every slot message of a wake, or a good part of a frame sent whole
_LENGTH, _LONG_LENGTH = struct.Struct("!i"), struct.Struct("!Q")  # multiprocessing.connection's message headers
_GONE = ("gone",)  # the inbox's mark: the worker's end of the pipe closed here
_NONE_YET: tuple[tuple[()], None] = ((), None)  # take(): nothing read yet


class ProcessCaptureSource(WorkerRestarts, FrameSource):
    """``config``'s source, decoded by a worker process into a shared ring of frame slots."""

    lends_buffers = True  # read() returns the ring's own arrays: the pipeline adopts them, no copy
    capture = "process"  # how the run's summary names this way of reading a source
    read_ahead = READ_AHEAD  # slots the worker decodes into beyond the pipeline's frames (attach)

    def __init__(self, config: Any) -> None:
        import dataclasses

        super().__init__(config.uri.strip())
        self._config = dataclasses.replace(config, capture="thread")
        self._proc: Any = None
        self._conn: Any = None
        self._poller: Any = None  # select.poll over the pipe (_ready)
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._ring: FrameRing | None = None
        self._ended = False
        self._expected = 0  # the next frame number the worker should send
        self.current: str | None = None
        self.worker_dropped = 0  # live: frames the worker had no free slot for, and its source's stale ones
        self._stale = 0  # live: frames that queued up here behind a newer one
        self.reconnecting = False  # a live source down, its worker reconnecting (metrics, summary)
        self._down: str | None = None  # a live source down at start whose worker waits to be told to go on
        self._late: tuple[int, Any] | None = None  # (frames, register) for the ring of a source not up yet
        self._held: tuple[Any, ...] | None = None  # a message read past the newest frame, for the next read
        self._close_by: float | None = None  # when a worker told to stop is killed (monotonic seconds)
        # pull()/take() (a collector's): whole messages read, the start of one not all there yet, the pipe's end
        self._inbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._partial = bytearray()
        self._pipe_closed = False
        self._fd = -1
        # join_hub(): the frames the worker sends through a collector's shared pipe, routed here by the hub
        self._hub_inbox: collections.deque[tuple[Any, ...]] = collections.deque()

    # -- lifetime ---------------------------------------------------------------------------------------
    @property
    def worker_pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def start(self) -> None:
        """Start the worker (it opens the source while the caller goes on); :meth:`open` waits for it. A
        pipeline starts every source's worker first, so 32 workers start in about the time of one."""
        from edgert.io.capture.worker import capture_main

        if self._proc is not None:
            return
        ctx = multiprocessing.get_context("spawn")  # never fork: the parent holds CUDA contexts and threads
        parent, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=capture_main, args=(self._config, child), daemon=True,
                                 name=f"edgert-capture:{self.uri}")
        self._proc.start()
        child.close()
        self._conn = parent
        self._fd = int(parent.fileno())  # pull() and give_back() read and write it directly
        self._poller = None
        self._inbox.clear()
        self._partial = bytearray()
        self._pipe_closed = False
        self._stopping.clear()

    def open(self) -> None:
        self.start()
        try:
            # a live source retries for its source.timeout_s inside the worker before it answers
            msg = self._recv(_OPEN_TIMEOUT_S + float(getattr(self._config, "timeout_s", None) or 0.0), "opening")
            if msg is None:
                raise SourceError(f"{self.uri}: stopped while opening")
            if msg[0] == "down":  # its worker waits: open_in_background, or close
                self._down = str(msg[1])
                self.live, self.kind = bool(msg[2]["live"]), str(msg[2]["kind"])
            elif msg[0] == "error":
                raise SourceError(msg[1])
        except BaseException:
            self.close()
            raise
        if self._down is not None:
            raise SourceError(self._down)
        self._opened_as(msg[1])

    def _opened_as(self, info: dict[str, Any]) -> None:
        self.width, self.height, self.fps = int(info["width"]), int(info["height"]), info["fps"]
        self.live, self.kind = bool(info["live"]), str(info["kind"])
        self._opened = True
        log.info("capture worker %d for %s: %dx%d (%s)", self._proc.pid, redact(self.uri), self.width, self.height,
                 self.kind)

    @property
    def open_in_background(self) -> Callable[[], None] | None:
        """For a live source that was down at start (:meth:`open` failed): have its worker go on reconnecting it
        in the background (:mod:`edgert.pipeline.startup` calls it when other sources opened). None otherwise:
        a file or a device that cannot open is not retried."""
        return self._reconnect_in_background if self._down is not None and self._proc is not None else None

    def _reconnect_in_background(self) -> None:
        self._down = None
        self._send(("background",))
        self.reconnecting = True
        self._late = (DEFAULT_FRAMES, None)
        self._opened = True

    def attach(self, frames: int, register: Any = None) -> None:
        """Make the ring: ``frames`` slots the pipeline may hold plus :data:`READ_AHEAD`. ``register(array,
        slot_bytes, slots)`` (the GPU processor's) pins it for the GPU."""
        if self._ring is not None:
            return
        self._attach_args = (frames, register)  # for the ring of a restarted worker
        if self._late is not None:  # not up yet: the ring is made at its first frame, sized by it
            self._late = (frames, register)
            return
        slot_bytes = slot_bytes_for(self.height, self.width)
        ring = FrameRing.create(frames + READ_AHEAD, slot_bytes)
        try:
            self._send(("ring", ring.name, ring.slots, slot_bytes))
            msg = self._recv(_OPEN_TIMEOUT_S, "attaching the frame ring")
            if msg is None or msg[0] != "attached":
                raise SourceError(msg[1] if msg is not None and msg[0] == "error"
                                  else f"{self.uri}: capture worker did not take the frame ring")
        finally:
            ring.unlink()  # both sides have it mapped (or the worker failed): the name is not needed again
        self._ring = ring
        if register is not None:
            from edgert.errors import BackendError

            try:
                register(ring.array, slot_bytes, ring.slots)
            except BackendError as exc:  # still correct, one host copy per frame more: say so, go on
                log.warning("%s: frame ring not page-locked (%s); frames go through the staging copy",
                            redact(self.uri), exc)

    def stop(self) -> None:
        self._stopping.set()

    def ask_to_stop(self) -> None:
        """Tell the worker to stop now, its grace period counted from now. The pipeline asks every worker before
        it closes the first, so closing N workers stuck in a camera's connect costs one grace period, not N."""
        self._stopping.set()
        if self._close_by is None and self._proc is not None:
            self._close_by = time.monotonic() + CLOSE_GRACE_S
            with contextlib.suppress(OSError):  # the worker is gone already: nothing to tell
                self._send(("stop",))

    def close(self) -> None:
        self.ask_to_stop()
        proc, conn = self._proc, self._conn
        if proc is not None:
            close_by = time.monotonic() + CLOSE_GRACE_S if self._close_by is None else self._close_by
            proc.join(timeout=max(0.0, close_by - time.monotonic()))
            if proc.is_alive():  # stuck in a driver call: it cannot finish anything we still want
                proc.kill()
                proc.join(timeout=2.0)
        if conn is not None:
            conn.close()
        self._proc = self._conn = None
        self._fd = -1
        self._poller = self._close_by = None
        self._inbox.clear()  # frames read and never taken: their slots go with the ring
        self._hub_inbox.clear()
        self._down = self._late = self._held = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        self._opened = False

    # -- frames -------------------------------------------------------------------------------------------
    def _read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        if self._ring is None:
            if self._proc is None:
                return None
            if self._late is not None:
                if not self._await_first_frame():
                    return None
            else:
                self.attach(DEFAULT_FRAMES)
        ring = self._ring
        assert ring is not None
        k = ring.slot_of(out)
        if k is not None:
            self._send(("free", k))  # the pipeline is done with the frame that lay there
        if self._ended:
            return None
        msg, self._held = self._held or self._recv(None, "reading"), None
        if msg is None:
            self.end_reason = "stopped"
            return None
        if self.live:  # several frames queued up: only the newest is the present
            while not self._stopping.is_set() and msg[0] == "frame" and self._conn.poll(0):
                newer = self._recv(0.0, "reading")
                if newer is None:
                    break
                if newer[0] != "frame":  # the end or an error after this frame: for the next read
                    self._held = newer
                    break
                self._take_counters(msg)
                if msg[1] >= 0:
                    self._send(("free", msg[1]))
                self._stale += 1
                self.dropped = self._stale + self.worker_dropped
                msg = newer
        return self._frame_of(msg, ring)

    def _frame_of(self, msg: tuple[Any, ...], ring: FrameRing) -> np.ndarray | None:
        """A worker's message as :meth:`read` and :meth:`receive` hand it on: the frame (a view of its ring slot),
        None at the end (its counters applied), the worker's error raised."""
        if msg[0] == "error":
            raise SourceError(msg[1])
        if msg[0] == "end":
            self._ended = True
            self._apply(msg[1])
            return None
        _, k, h, w, seq, _counters, current, pixels = msg
        self._take_counters(msg)
        if not self.live and seq != self._expected:  # pragma: no cover - the pipe keeps order; a bug if not
            raise SourceError(f"{self.uri}: capture worker sent frame {seq}, expected {self._expected}")
        self._expected = seq + 1
        self.current = current
        if k < 0:  # did not fit a slot: it came through the pipe (the pipeline adopts the array)
            frame: np.ndarray = pixels
            return frame
        return ring.view(k, h, w)

    def _await_first_frame(self) -> bool:
        """A source reconnected in the background: wait (reporting its state as the worker sends it) until it is
        up, then make its ring for the frames asked at :meth:`attach`; False when stopped first."""
        msg = self._recv(None, "reading")
        if msg is None:
            self.end_reason = "stopped"
            return False
        if msg[0] == "error":
            raise SourceError(msg[1])
        if msg[0] != "up":  # pragma: no cover - the worker sends nothing else before it is up; a bug if it does
            raise SourceError(f"{self.uri}: capture worker sent {msg[0]!r} before its first frame")
        self._opened_as(msg[1])
        assert self._late is not None
        frames, register = self._late
        self._late = None
        self.attach(frames, register)
        return True

    # -- many sources in one thread (edgert.pipeline.collector) ------------------------------------------
    def fileno(self) -> int:
        """The pipe's descriptor: readable when the worker has sent something (a frame, the end, an error)."""
        if self._conn is None:
            raise SourceError(f"{self.uri}: capture worker is not running")
        return int(self._conn.fileno())

    def join_hub(self, hub: MessageHub, tag: int) -> bool:
        """Have the worker send its frames in slots through ``hub`` (one pipe a collector reads for all its
        sources), tagged ``tag``; :meth:`pull` still reads the rest from the own pipe and :meth:`take` merges the
        two in frame order. False (nothing changed) when the ring is not made yet or the worker is gone."""
        from multiprocessing.reduction import send_handle

        conn, proc = self._conn, self._proc
        if self._ring is None or conn is None or proc is None or self._pipe_closed or hub.writer < 0:
            return False
        hub.route(tag, self._hub_inbox)
        # The descriptor right behind its message, nothing between (the worker reads them in turn).
        with self._send_lock:
            try:
                conn.send(("hub", tag))
                send_handle(conn, hub.writer, proc.pid)
            except OSError:  # gone: its pipe's end says how, at the next pull
                return False
        return True

    def give_back(self, slots: list[int]) -> None:
        """Ring ``slots`` (as :meth:`take` named them) free for the worker again: one message for all, written
        as ``Connection.send`` frames it (a dozen Python calls fewer per message, one per source and batch)."""
        fd = self._fd
        if not slots or self._ring is None or fd < 0:
            return
        body = pickle.dumps(("free", *slots), pickle.HIGHEST_PROTOCOL)
        data = _LENGTH.pack(len(body)) + body
        # A worker gone: its pipe's end says how, at the next pull.
        with self._send_lock, contextlib.suppress(OSError):
            while data:
                data = data[os.write(fd, data):]

    @property
    def wants_pull(self) -> bool:
        """Whether :meth:`pull` should read the pipe when it is readable: not once the pipe has ended (it stays
        readable), nor while the messages read fill the worker's ring and :meth:`take` took none of them (so a
        worker that sends frames through the pipe, each larger than a slot, waits on the pipe as it does for a
        reader that takes one message at a time)."""
        ring = self._ring
        return not self._pipe_closed and (ring is None or len(self._inbox) < ring.slots)

    def pull(self) -> bool:
        """Read what the worker's pipe holds (once :meth:`fileno` is readable) into whole messages for :meth:`take`.

        One system call for every message that came since the last wake, where ``Connection.recv`` makes two per
        message and a dozen Python calls (docs/results/README.md: host calls). The bytes are the framing the worker's
        ``Connection.send`` writes (:mod:`multiprocessing.connection`: a 4-byte big-endian signed length, or -1
        and an 8-byte one past 2 GiB, then the pickle); a message read in part waits here for its rest. The end
        of the pipe (the worker gone) is a message too, after the ones before it. Returns :attr:`wants_pull`."""
        if self._fd < 0 or self._pipe_closed:
            return False
        try:
            data = os.read(self._fd, _PULL_BYTES)
        except BlockingIOError:  # pragma: no cover - poll said readable; nothing after all
            return True
        except OSError:
            data = b""
        if not data:
            self._pipe_closed = True
            self._inbox.append(_GONE)
            return False
        buf = self._partial
        buf += data
        pos, end = 0, len(buf)
        with memoryview(buf) as view:
            while end - pos >= 4:
                (n,) = _LENGTH.unpack_from(buf, pos)
                start = pos + 4
                if n == -1:
                    if end - start < 8:
                        break
                    (n,) = _LONG_LENGTH.unpack_from(buf, start)
                    start += 8
                if end - start < n:
                    break
                self._inbox.append(pickle.loads(view[start:start + n]))
                pos = start + n
        del buf[:pos]
        return len(self._inbox) < self._ring.slots if self._ring is not None else True

    def take(self, most: int) -> tuple[Sequence[tuple[np.ndarray, int, str | None]], str | SourceError | None]:
        """Up to ``most`` of the frames :meth:`pull` read (and the hub routed here, :meth:`join_hub`), in order,
        each as (its pixels: a view of its ring slot; the slot, -1 for a frame that came through the pipe; its
        file), and what comes after them once no frame is left before it: None (more may come), "end" (the source
        ended; ``end_reason`` says why) or the :class:`SourceError` of a worker that failed or is gone (returned,
        not raised: the caller decides).

        The hub's frames and the own pipe's messages are merged by frame number: a frame sent through the pipe
        (larger than a slot) between two in slots is taken in its turn, and the end, an error or the pipe's end is
        taken only once the hub has no frame left for it (the collector reads the hub after the own pipes, so
        every frame sent before that message is there by then: :mod:`.hub`)."""
        inbox, hub, ring = self._inbox, self._hub_inbox, self._ring
        if ring is None or not (inbox or hub):
            return _NONE_YET
        frames: list[tuple[np.ndarray, int, str | None]] = []
        expected = self._expected
        while most:
            if hub and hub[0][4] == expected:
                msg = hub.popleft()
            elif inbox and inbox[0][0] == "frame" and inbox[0][4] == expected:
                msg = inbox.popleft()
            elif inbox and inbox[0][0] == "state":  # pragma: no cover - only a live source's worker sends these
                self._apply(inbox.popleft()[1])
                continue
            else:  # the next frame is not here yet, or what comes after the frames is
                break
            most -= 1
            _, k, h, w, seq, counters, current, pixels = msg
            if counters is not None:
                self._apply(counters)
            expected = seq + 1
            frames.append((ring.view(k, h, w) if k >= 0 else pixels, k, current))
        self._expected = expected
        if frames:
            self.current = frames[-1][2]
        if hub or not inbox or inbox[0][0] == "frame" or self._ended:
            if hub and hub[0][4] < expected:  # pragma: no cover - each pipe keeps order; a bug if not
                return frames, SourceError(f"{self.uri}: capture worker sent frame {hub[0][4]} twice")
            return frames, None
        msg = inbox.popleft()
        if msg is _GONE:
            return frames, self._gone_error("reading")
        if msg[0] == "end":
            self._ended = True
            self._apply(msg[1])
            return frames, "end"
        return frames, SourceError(msg[1])

    def _take_counters(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "frame" and msg[5] is not None:
            self._apply(msg[5])

    def _apply(self, counters: tuple[Any, ...]) -> None:
        dropped, skipped, reconnects, self.stalls, end_reason, self.ended_early, self.reconnecting = counters
        self.reconnects = int(reconnects) + self.worker_restarts  # a worker's own count starts at 0 again
        self.worker_dropped = int(dropped)
        self.dropped = self._stale + self.worker_dropped
        self.skipped_by_reason = dict(skipped)
        self.skipped = sum(self.skipped_by_reason.values())
        if end_reason is not None:
            self.end_reason = end_reason

    # -- the pipe -----------------------------------------------------------------------------------------
    def _send(self, msg: tuple[Any, ...]) -> None:
        conn = self._conn
        if conn is None:
            return
        # stop()/close() may come from another thread than read(); a worker gone: the next pull says how.
        with self._send_lock, contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
            conn.send(msg)

    def _ready(self, conn: Any, wait: float) -> bool:
        """``conn.poll(wait)`` through one ``select.poll`` object kept for the pipe: ``Connection.poll`` makes a
        selector, registers and closes it on every call, a dozen Python calls per frame in the pipeline's process
        (docs/results/README.md: host calls). True too when the worker's end closed (the receive then says how)."""
        poller = self._poller
        if poller is None:
            if not hasattr(select, "poll"):  # pragma: no cover - not on Linux
                return bool(conn.poll(wait))
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            self._poller = poller
        return bool(poller.poll(wait * 1000.0))

    def _recv(self, timeout: float | None, doing: str) -> tuple[Any, ...] | None:
        """The worker's next message; None when stopped first; SourceError when the worker is gone or ``timeout``
        (seconds; None: no limit, the worker's own source times out stalls) passes."""
        conn = self._conn
        if conn is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._stopping.is_set() and doing == "reading":
                return None
            wait = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            try:
                if self._ready(conn, wait):
                    msg: tuple[Any, ...] = conn.recv()
                    if msg[0] != "state":
                        return msg
                    self._apply(msg[1])  # a live source's counters between frames: taken here, for every caller
                    continue
            except (EOFError, OSError):
                break
            if deadline is not None and time.monotonic() >= deadline:
                if timeout == 0.0:
                    return None
                raise SourceError(f"{self.uri}: capture worker gave no answer within {timeout:g} s while {doing}")
        self._gone(doing)

    def _gone(self, doing: str) -> NoReturn:
        """The worker's end of the pipe closed: a SourceError saying how the worker ended."""
        raise self._gone_error(doing)

    def _gone_error(self, doing: str) -> SourceError:
        proc = self._proc
        if proc is not None:
            proc.join(timeout=1.0)
        code = None if proc is None else proc.exitcode
        self._died = True
        return SourceError(f"{self.uri}: capture worker {process_ended(code)} while {doing}")
