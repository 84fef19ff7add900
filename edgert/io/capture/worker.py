"""The capture worker: one process per source that opens it, decodes every frame into the shared ring and
says which slot holds which frame.

Messages on the pipe (small tuples, pickled by multiprocessing):

- worker -> parent: ``("opened", info)`` once; ``("attached",)`` once the ring is mapped;
  ``("frame", slot, height, width, seq, counters, current)`` per frame (``slot`` -1: the frame did not fit a
  slot and travels in the message itself, as ``current``'s neighbour ``pixels``); ``("end", counters)``;
  ``("error", text)``; ``("state", counters)`` when a live source's counters change between frames (it went
  down, is reconnecting, came back: the parent reports it while no frame comes).
- parent -> worker: ``("ring", name, slots, slot_bytes)``; ``("free", slot, ...)`` when the pipeline is done with
  one slot or several; ``("stop",)``; ``("hub", tag)`` followed by the write end of a collector's shared pipe
  (passed as a descriptor over the socket, :mod:`.hub`): from then on the frames in a slot go there, tagged,
  and the rest (a frame through the pipe, the end, an error) still here, after them.

A live source still down at start (after its own retries for ``source.timeout_s``) says ``("down", text,
info)`` instead of ``("error", text)`` and waits: ``("background",)`` from a parent whose other sources opened
has it go on reconnecting with the backoff of a stream lost mid-run (``LiveSource.open_in_background``, as the
in-process capture does), sending ``("state", counters)`` as it goes; at its first frame it says ``("up",
info)`` with the size it learnt, and the ring handshake follows then (a ring is sized by the frames);
``("stop",)`` ends it.

Files deliver every frame: with no free slot the worker waits for one (back-pressure, as the in-process
capture waits for a free frame buffer). Live sources never wait: a frame with no free slot to go to is
dropped here and counted, and the parent keeps only the newest of the frames that queued up.

The worker ignores SIGINT and SIGTERM: a Ctrl-C or a service stop reaches the whole process group, and the
parent, which owns the run, stops its workers itself after the frames in flight. A parent that dies closes
the pipe, and the worker ends at its next message check.
"""

from __future__ import annotations

import collections
import signal
import threading
from typing import Any

import numpy as np

from edgert.io.capture.hub import HubWriter

__all__ = ["capture_main"]


_STATE_S = 0.2  # how often a live source's counters are looked at between frames


def _counters(source: Any) -> tuple[Any, ...]:
    return (int(source.dropped), dict(source.skipped_by_reason), int(source.reconnects), int(source.stalls),
            source.end_reason, bool(source.ended_early), bool(getattr(source, "reconnecting", False)))


class _Reporter:
    """The worker's sending end: one lock for the delivering thread and the watcher of a live source, and the
    counters last sent, taken under that lock so the parent gets them in the order they changed."""

    def __init__(self, conn: Any, source: Any) -> None:
        self.conn = conn
        self.source = source
        self._lock = threading.Lock()
        self._sent = _counters(source)
        self._done = threading.Event()
        self.hub: HubWriter | None = None  # a collector's shared pipe, once the parent has sent it

    def send(self, msg: tuple[Any, ...]) -> None:
        with self._lock:
            self.conn.send(msg)

    def frame(self, k: int, h: int, w: int, seq: int, current: Any, pixels: Any) -> None:
        with self._lock:
            now = _counters(self.source)
            msg = ("frame", k, h, w, seq, None if now == self._sent else now, current, pixels)
            hub = self.hub
            if hub is None or k < 0 or not hub.send(msg):  # a frame through the pipe is too large for the hub
                self.conn.send(msg)
            self._sent = now

    def join_hub(self, tag: int) -> None:
        """The parent's ``("hub", tag)``: its descriptor follows on the socket; frames in slots go there now."""
        from multiprocessing.reduction import recv_handle

        fd = recv_handle(self.conn)
        with self._lock:
            if self.hub is not None:  # pragma: no cover - the parent sends one hub per worker
                self.hub.close()
            self.hub = HubWriter(fd, tag)

    def state(self) -> None:
        """Send the counters when they changed since the last message that carried them."""
        with self._lock:
            now = _counters(self.source)
            if now != self._sent:
                self.conn.send(("state", now))
                self._sent = now

    def watch(self) -> None:
        """For a live source: send its changes while no frame comes (a camera that went down blocks ``read``
        in its reconnecting, and the parent would hear of it only at the next frame)."""
        def loop() -> None:
            try:
                while not self._done.wait(_STATE_S):
                    self.state()
            except (OSError, EOFError):  # the parent went away: the main thread ends at its next message
                return

        threading.Thread(target=loop, name="edgert-capture-state", daemon=True).start()

    def close(self) -> None:
        self._done.set()
        if self.hub is not None:
            self.hub.close()


def capture_main(config: Any, conn: Any) -> None:
    """Worker process entry point: ``config`` is the source's SourceConfig, ``conn`` the worker's pipe end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _run(config, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent went away: nobody to deliver to
    except BaseException as exc:  # reported to the parent, which raises it as this source's failure
        try:
            conn.send(("error", f"{config.uri}: capture worker failed: {type(exc).__name__}: {exc}"))
        except (OSError, EOFError):
            return


def _run(config: Any, conn: Any) -> None:
    from edgert.errors import EdgertError
    from edgert.io.capture.jetson import worker_source
    from edgert.io.capture.ring import FrameRing

    try:
        source = worker_source(config)
    except EdgertError as exc:
        conn.send(("error", str(exc)))
        return
    reporter = _Reporter(conn, source)
    try:
        first = None
        try:
            source.open()
        except EdgertError as exc:
            if getattr(source, "open_in_background", None) is None:
                conn.send(("error", str(exc)))
                return
            first = _open_later(source, conn, reporter, str(exc))
            if first is None:
                return
        else:
            conn.send(("opened", _info(source)))
        msg = conn.recv()
        if msg[0] != "ring":
            return
        _, name, slots, slot_bytes = msg
        ring = FrameRing.attach(name, slots, slot_bytes)
        try:
            reporter.send(("attached",))
            if source.live:
                reporter.watch()
            _deliver(source, ring, conn, reporter, first)
        finally:
            ring.close()
    finally:
        reporter.close()
        source.close()


def _info(source: Any) -> dict[str, Any]:
    return {"width": source.width, "height": source.height, "fps": source.fps, "live": source.live,
            "kind": source.kind, "info": source.info()}


def _open_later(source: Any, conn: Any, reporter: _Reporter, error: str) -> np.ndarray | None:
    """A live source still down at start: say so, and when the parent says go on, reconnect it in the background
    until its first frame (returned, after ``("up", info)``); None when the parent stops it first."""
    conn.send(("down", error, {"live": bool(source.live), "kind": str(source.kind)}))
    msg = conn.recv()
    if msg[0] != "background":
        return None
    source.open_in_background()
    while not source.width:  # learnt from its first frame by the grabber, just before that frame is published
        reporter.state()  # reconnecting, and each failed attempt's counters, while nobody reads frames
        if conn.poll(_STATE_S):
            msg = conn.recv()
            if msg[0] == "stop":
                return None
    frame: np.ndarray | None = source.read()  # published right after its size was learnt: no wait
    if frame is not None:
        reporter.send(("up", _info(source)))
    return frame


def _deliver(source: Any, ring: Any, conn: Any, reporter: _Reporter, first: np.ndarray | None = None) -> None:
    free: collections.deque[int] = collections.deque(range(ring.slots))
    live = bool(source.live)
    shape = (int(source.height), int(source.width))
    scratch: np.ndarray | None = None
    seq = 0
    while True:
        # Take every message that is waiting; with no free slot a file waits here for one.
        while conn.poll(0) or (not free and not live):
            msg = conn.recv()
            if msg[0] == "free":  # one slot or several (a collector gives a wake's worth back at once)
                free.extend(msg[1:])
            elif msg[0] == "hub":
                reporter.join_hub(int(msg[1]))
            elif msg[0] == "stop":
                return
        if not free:  # live, nowhere to put it: decode anyway (the camera runs on) and drop it
            if scratch is None or scratch.shape[:2] != shape:
                scratch = np.empty((*shape, 3), np.uint8)
            frame = source.read(scratch)
            if frame is None:
                break
            source.dropped += 1
            continue
        k = free.popleft()
        out = ring.view(k, *shape) if shape[0] * shape[1] * 3 <= ring.slot_bytes else None
        if first is not None:  # a late source's first frame, read before the ring was there
            frame, first = first, None
        else:
            frame = source.read(out)
        if frame is None:
            free.appendleft(k)
            break
        h, w = int(frame.shape[0]), int(frame.shape[1])
        pixels = None
        if frame is not out:
            shape = (h, w)
            if h * w * 3 <= ring.slot_bytes and frame.dtype == np.uint8 and frame.ndim == 3:
                np.copyto(ring.view(k, h, w), frame)  # a new size that still fits the slot
            else:  # larger than a slot (a folder of mixed sizes): this one travels through the pipe
                free.appendleft(k)
                k, pixels = -1, np.ascontiguousarray(frame)
        current = getattr(source, "current", None)
        reporter.frame(k, h, w, seq, None if current is None else str(current), pixels)
        seq += 1
    reporter.send(("end", _counters(source)))
    # Stay until the parent has let go (it unmaps the ring after us either way).
    while True:
        msg = conn.recv()
        if msg[0] == "hub":  # its descriptor follows: taken off the socket, so the next message reads whole
            reporter.join_hub(int(msg[1]))
        elif msg[0] == "stop":
            return
