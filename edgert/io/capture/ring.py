"""A ring of frame slots in POSIX shared memory, written by a capture worker and read in place by the pipeline.

The parent creates the segment, the worker attaches to it by name, and the parent unlinks the name as soon as
the worker has attached: from then on the memory has no name at all, only two mappings, so nothing can be
left behind in ``/dev/shm`` however either process ends (SIGKILL included). The memory itself goes when the
last mapping goes.

Slots are ``slot_bytes`` apart, a whole number of pages, so each slot starts page-aligned: the GPU processor
registers the whole segment with CUDA once (page-locked, one DMA per frame; mapped on Jetson) and reads a frame
where the worker decoded it.
"""

from __future__ import annotations

import atexit
import logging
from multiprocessing import shared_memory
from typing import Any

import numpy as np

__all__ = ["PAGE", "FrameRing", "slot_bytes_for"]

log = logging.getLogger(__name__)

PAGE = 4096

#: Segments whose mapping could not be closed yet because arrays over it were still alive (the pipeline's
#: frames, a CUDA registration); closed at the next chance instead of warning from a destructor.
_LINGERING: list[shared_memory.SharedMemory] = []


def slot_bytes_for(height: int, width: int) -> int:
    """Bytes of one slot for BGR frames of this size, rounded up to whole pages."""
    return -(-(height * width * 3) // PAGE) * PAGE


@atexit.register
def _close_lingering() -> None:
    for shm in list(_LINGERING):
        try:
            shm.close()
        except BufferError:  # still in use: next time
            continue
        _LINGERING.remove(shm)


class FrameRing:
    """``slots`` frame slots of ``slot_bytes`` each; ``view(k, h, w)`` is slot ``k`` as an HxWx3 uint8 array."""

    def __init__(self, shm: shared_memory.SharedMemory, slots: int, slot_bytes: int, owner: bool) -> None:
        self.shm = shm
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.owner = owner
        self.name = shm.name
        self._linked = owner
        buf = shm.buf
        if buf is None:  # pragma: no cover - only after close
            raise RuntimeError("shared memory is closed")
        self.array: np.ndarray = np.frombuffer(buf, np.uint8, count=slots * slot_bytes)
        self._views: dict[tuple[int, int, int], np.ndarray] = {}
        self._addresses = {self.address(k): k for k in range(slots)}

    @classmethod
    def create(cls, slots: int, slot_bytes: int) -> FrameRing:
        _close_lingering()
        shm = shared_memory.SharedMemory(create=True, size=max(1, slots * slot_bytes))
        return cls(shm, slots, slot_bytes, owner=True)

    @classmethod
    def attach(cls, name: str, slots: int, slot_bytes: int) -> FrameRing:
        return cls(shared_memory.SharedMemory(name=name), slots, slot_bytes, owner=False)

    def address(self, k: int) -> int:
        return int(self.array.__array_interface__["data"][0]) + k * self.slot_bytes

    def slot_of(self, frame: Any) -> int | None:
        """Which slot ``frame`` is the view of (None: not one of ours)."""
        if not isinstance(frame, np.ndarray):
            return None
        return self._addresses.get(int(frame.__array_interface__["data"][0]))

    def view(self, k: int, height: int, width: int) -> np.ndarray:
        """Slot ``k`` as a C-contiguous HxWx3 array (cached: the same array object for the same shape)."""
        key = (k, height, width)
        v = self._views.get(key)
        if v is None:
            if height * width * 3 > self.slot_bytes:
                raise ValueError(f"a {width}x{height} frame does not fit a slot of {self.slot_bytes} bytes")
            start = k * self.slot_bytes
            v = self.array[start:start + height * width * 3].reshape(height, width, 3)
            self._views[key] = v
        return v

    def unlink(self) -> None:
        """Remove the name (the mappings stay valid). Only the creator unlinks; once."""
        if self.owner and self._linked:
            self._linked = False
            try:
                self.shm.unlink()
            except FileNotFoundError:  # already gone (the resource tracker after a crash): nothing to remove
                pass

    def close(self) -> None:
        """Unlink (creator) and unmap; when arrays over the memory are still alive, unmap later instead."""
        self.unlink()
        self._views.clear()
        self._addresses.clear()
        del self.array
        try:
            self.shm.close()
        except BufferError:  # frames or a CUDA registration still point into it: closed once they are gone
            _LINGERING.append(self.shm)
