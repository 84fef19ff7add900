"""The ring of frame buffers: how many frames each source gets, their pixel buffers, and letting go of them.

Apart from :mod:`edgert.pipeline.runner` because it is decided once, before any output is truncated (its memory
is checked first), and undone once, before the processor closes; while the run goes, frames only circulate.
What a frame is lives in :mod:`edgert.pipeline.feeds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgert.pipeline.feeds import _Feed, _Frame

if TYPE_CHECKING:
    from edgert.pipeline.processor import Processor

__all__ = ["allocate_frames", "release_frames"]


def allocate_frames(feeds: Sequence[_Feed], processor: Processor, queue_size: int) -> None:
    """Give every source that opened its frames (free to be captured into), after checking they fit in memory."""
    # Enough frames per source for every slot to hold its share of a batch while the capture fills the next;
    # each one more only waits in a queue, a frame of latency per source (Little's law: a file source runs
    # ahead as far as it has frames). Twice the slots (an earlier setting) kept two batches waiting: at 16
    # streams that was a third of every frame's latency, for no throughput (a capture worker decodes ahead
    # into its own ring's spare slots, and queue_size still sets the floor).
    share = max(1, -(-processor.batch // len(feeds)))
    count = max(queue_size, (len(processor.slots) + 1) * share)
    # A capture worker decodes ahead into its ring's spare slots (``read_ahead`` of them), so those count among
    # the source's frames: its feed keeps one frame per slot's share, the worker's ring holds the frames that come
    # next. At 16 NanoDet streams on the H200 that is 3 frames in flight per source instead of 4: a quarter less
    # latency (Little's law) (docs/pipeline.md).
    from edgert.pipeline.limits import check_frame_memory

    check_frame_memory([(f.name, int(f.source.width or 0), int(f.source.height or 0))
                        for f in feeds if f.opened], count)  # before any output is truncated
    for feed in feeds:
        if not feed.opened:
            continue
        attach = getattr(feed.source, "attach", None)
        if attach is not None:  # a capture worker's ring: its slots are the frames' pixels, lent per frame
            ahead = int(getattr(feed.source, "read_ahead", 0) or 0)
            frames = max(len(processor.slots) * share, count - ahead) if ahead else count
            attach(frames, getattr(processor, "register_frames", None))
            feed.frames = tuple(_Frame(feed=feed.index) for _ in range(frames))
        else:
            feed.frames = tuple(_Frame(feed=feed.index, pixels=_frame_buffer(processor, feed))
                                for _ in range(count))
        for f in feed.frames:
            feed.free.put(f)


def _frame_buffer(processor: Processor, feed: _Feed) -> np.ndarray | None:
    """The processor's buffer for this source's frame size (GPU: page-locked), or None (the first read
    allocates one). A source that does not know its size yet, or changes it, simply gets new arrays."""
    width, height = getattr(feed.source, "width", None), getattr(feed.source, "height", None)
    make = getattr(processor, "frame_buffer", None)
    if not width or not height or make is None:
        return None
    buf: np.ndarray | None = make(int(height), int(width))
    return buf


def release_frames(feeds: Sequence[_Feed]) -> None:
    """Let go of the frames' pixel buffers before the processor closes (its page-locked memory is freed
    with its CUDA context current)."""
    for feed in feeds:
        for f in feed.frames:
            f.pixels = None
