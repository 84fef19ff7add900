"""The capture worker: one process per source that opens it, decodes every frame into the shared ring and
says which slot holds which frame.

Messages on the pipe (small tuples, pickled by multiprocessing):

- worker -> parent: ``("opened", info)`` once; ``("attached",)`` once the ring is mapped;
  ``("frame", slot, height, width, seq, counters, current)`` per frame (``slot`` -1: the frame did not fit a
  slot and travels in the message itself, as ``current``'s neighbour ``pixels``); ``("end", counters)``;
  ``("error", text)``.
- parent -> worker: ``("ring", name, slots, slot_bytes)``; ``("free", slot, ...)`` when the pipeline is done with
  one slot or several; ``("stop",)``.

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
from typing import Any

import numpy as np

__all__ = ["capture_main"]


def _counters(source: Any) -> tuple[Any, ...]:
    return (int(source.dropped), dict(source.skipped_by_reason), int(source.reconnects), int(source.stalls),
            source.end_reason, bool(source.ended_early))


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
    from edgert.vision.capture.jetson import worker_source
    from edgert.vision.capture.ring import FrameRing

    try:
        source = worker_source(config)
        source.open()
    except EdgertError as exc:
        conn.send(("error", str(exc)))
        return
    try:
        conn.send(("opened", {"width": source.width, "height": source.height, "fps": source.fps,
                              "live": source.live, "kind": source.kind, "info": source.info()}))
        msg = conn.recv()
        if msg[0] != "ring":
            return
        _, name, slots, slot_bytes = msg
        ring = FrameRing.attach(name, slots, slot_bytes)
        try:
            conn.send(("attached",))
            _deliver(source, ring, conn)
        finally:
            ring.close()
    finally:
        source.close()


def _deliver(source: Any, ring: Any, conn: Any) -> None:
    free: collections.deque[int] = collections.deque(range(ring.slots))
    live = bool(source.live)
    shape = (int(source.height), int(source.width))
    scratch: np.ndarray | None = None
    sent = _counters(source)
    seq = 0
    while True:
        # Take every message that is waiting; with no free slot a file waits here for one.
        while conn.poll(0) or (not free and not live):
            msg = conn.recv()
            if msg[0] == "free":  # one slot or several (a collector gives a wake's worth back at once)
                free.extend(msg[1:])
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
        now = _counters(source)
        current = getattr(source, "current", None)
        conn.send(("frame", k, h, w, seq, None if now == sent else now,
                   None if current is None else str(current), pixels))
        sent = now
        seq += 1
    conn.send(("end", _counters(source)))
    # Stay until the parent has let go (it unmaps the ring after us either way).
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
