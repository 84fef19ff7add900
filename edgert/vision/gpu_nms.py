"""NMS on the GPU after the confidence filter, so a batch's final boxes come back in one small copy.

The host's finishing step after :class:`~edgert.vision.gpu_decode.GpuCandidateFilter` (the rows of every
sample, one NMS, the mapping, about 40 numpy calls and OpenCV's NMS per batch) gave the interpreter lock up
several times per batch on each slot thread, and each time the thread waited to get it back behind the other
pipeline threads: at 16 NanoDet streams on the H200 that step took 5-6 ms of wall time per batch for about 2 ms
of work (docs/pipeline.md). ``kernels/nms.cu`` does the same steps on the device, step for step (class filter,
best-first order, OpenCV's greedy class-aware NMS, ``max_det``, the mapping to the frame in float32), one block
per sample and one launch for the batch, whose last block packs every sample's boxes one after another; one copy
brings them back with the per-sample counts. The launch also takes each sample's count from the filter's device
counter and resets it, so the filter's own count launch is not made: every launch and copy is a driver call made
while the slot's thread holds the interpreter lock (measured on the H200: about 10-40 us each with three slots
and ONNX Runtime's threads calling the driver at once). The host then cuts each frame's :class:`Detections` out of
three arrays: a fixed number of numpy calls per batch and one constructor per frame.

A sample whose candidates overflowed the filter's buffer is flagged (a negative count) and decoded on the host from the
whole output, as before. Boxes are the host path's (the same float32 operations); the overlap is OpenCV's
formula in double, so only a pair whose IoU sits within rounding of ``decode.iou`` could be decided otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgert.errors import ModelError
from edgert.vision.decoders import Decoder
from edgert.vision.detections import Detections
from edgert.vision.gpu_preprocess import kernel_source
from edgert.vision.preprocess import LetterboxTransform

__all__ = ["GpuNms", "gpu_nms_fits", "split_packed"]

log = logging.getLogger(__name__)

_THREADS = 256
_KEPT_COLS = 6
_TABLE_COLS = 6
#: shared memory of the NMS kernel per candidate row: box (16), score, class, anchor, order (4 each), 2 flags
_SHARED_PER_ROW = 34
_SHARED_LIMIT = 48 * 1024  # what every CUDA GPU gives a block without opting in


def _shared_bytes(capacity: int, batch: int) -> int:
    """The NMS kernel's dynamic shared memory: the packing's offsets (16-byte aligned), then the rows."""
    return -(-(4 * (batch + 1)) // 16) * 16 + capacity * _SHARED_PER_ROW


def gpu_nms_fits(decoder: Decoder, capacity: int, batch: int = 1) -> str:
    """Why the GPU NMS cannot take this decoder's finishing step ('' when it can)."""
    config = getattr(decoder, "config", None)
    if config is None or getattr(decoder, "_finish_batch", None) is None:
        return f"decoder {getattr(decoder, 'kind', '?')} has no batch finishing step"
    if _shared_bytes(capacity, batch) > _SHARED_LIMIT:
        return f"{capacity} candidate rows do not fit the NMS kernel's shared memory"
    if int(config.max_det) < 1:
        return "decode.max_det < 1"
    return ""


class GpuNms:
    """The NMS and packing kernels, their buffers and the copy back, for one slot's stream.

    ``enqueue`` reads the filter's per-sample regions (device address ``buf_ptr``, ``capacity`` rows each),
    ``finish`` (after the stream has synchronised) returns each sample's :class:`Detections`, or None for a
    sample that overflowed. ``mapped``: the packed output lives in mapped page-locked memory the kernel writes
    directly (zero-copy); otherwise it is copied back with one async copy that keeps the interpreter lock.
    """

    def __init__(self, decoder: Decoder, num_classes: int, capacity: int, batch: int, device: Any,
                 mapped: bool = False) -> None:
        from edgert.backends.cuda import compile_kernels, memset_d32_async

        why = gpu_nms_fits(decoder, capacity, batch)
        if why:
            raise ModelError(f"GPU NMS: {why}")
        config = decoder.config  # type: ignore[attr-defined]  # gpu_nms_fits checked it is there
        self.names: tuple[str, ...] = tuple(decoder.names)
        self._empty = Detections.empty(self.names)
        self.capacity = int(capacity)
        self.batch = int(batch)
        self.max_det = int(config.max_det)
        self.iou = np.float32(config.iou)
        self.agnostic = np.int32(1 if config.agnostic else 0)
        self.device = device
        self.mapped = mapped
        self._batch_pad = -(-self.batch // 4) * 4  # counts padded so the float sections stay 16-byte aligned
        cap = self.batch * self.max_det
        words = self._batch_pad + cap * _KEPT_COLS
        with device.active():
            self._nms = compile_kernels(kernel_source("nms.cu"), ("edgert_nms_batch",))["edgert_nms_batch"]
            self._kept = device.alloc(4 * cap * _KEPT_COLS)
            self._kept_count = device.alloc(4 * self.batch)
            self._finished = device.alloc(4)  # the blocks' tickets: the last one packs (reset by it)
            stream = device.stream()
            memset_d32_async(self._finished.ptr, 0, 1, stream)
            stream.synchronize()
            self.table = device.pinned_empty((self.batch, _TABLE_COLS), np.float32)
            self._table_dev = device.alloc(self.table.nbytes)
            self.host = device.pinned_empty((words,), np.int32, mapped=mapped)
            self.host.fill(0)
            if mapped:
                self._out_dev = None
                self._out_ptr = device.device_pointer_of_mapped(self.host)
            else:
                self._out_dev = device.alloc(self.host.nbytes)
                self._out_ptr = self._out_dev.ptr
            self._allowed = None
            self._num_allowed = np.int32(0)
            if config.classes is not None:
                flags = np.zeros(max(num_classes, 1), np.uint8)
                wanted = np.asarray(config.classes, np.int64)
                flags[wanted[(wanted >= 0) & (wanted < flags.shape[0])]] = 1
                staged = device.pinned_empty(flags.shape, np.uint8)
                staged[:] = flags
                self._allowed = device.alloc(flags.nbytes)
                self._allowed.copy_from_host_async(staged, stream)
                stream.synchronize()
                self._num_allowed = np.int32(flags.shape[0])
        self._args_tail = (self.iou, self.agnostic, np.int32(self.max_det), np.uintp(self._kept.ptr),
                           np.uintp(self._kept_count.ptr), np.uintp(self._finished.ptr), np.int32(self._batch_pad),
                           np.uintp(self._out_ptr))

    def enqueue(self, counters_ptr: int, buf_ptr: int, transforms: Sequence[LetterboxTransform],
                stream: Any) -> None:
        """NMS for the first ``len(transforms)`` samples of the filter's buffer at ``buf_ptr`` (their counts in
        the filter's device counters at ``counters_ptr``, reset here) and the copy back of their final boxes, on
        ``stream``; nothing waits here."""
        from edgert.backends.cuda import copy_dtoh_async_pinned, copy_htod_async_pinned

        n = len(transforms)
        if not 1 <= n <= self.batch:
            raise ModelError(f"GPU NMS of {self.batch} sample(s) cannot take {n}")
        # The same float32 table as the host mapping (_to_original_batch): float64 values cast once.
        self.table[:n] = np.asarray([(t.pad_x, t.scale_x, t.pad_y, t.scale_y, t.src_width, t.src_height)
                                     for t in transforms], np.float64)
        copy_htod_async_pinned(self._table_dev.ptr, self.table[:n], stream)
        allowed = 0 if self._allowed is None else self._allowed.ptr
        self._nms.launch((n, 1, 1), (_THREADS, 1, 1),
                         (np.uintp(counters_ptr), np.uintp(buf_ptr), np.int32(self.capacity),
                          np.uintp(self._table_dev.ptr), np.uintp(allowed), self._num_allowed, *self._args_tail),
                         stream, shared=_shared_bytes(self.capacity, n))
        if not self.mapped:
            copy_dtoh_async_pinned(self.host, self._out_ptr, stream)

    def finish(self, n: int) -> tuple[list[Detections | None], list[int]]:
        """Each of the first ``n`` samples' detections (after the stream has synchronised), None where the
        sample's candidates overflowed the filter's buffer (the caller decodes it from the whole output), and
        the candidate counts of those that overflowed."""
        # The kernel lays its output out for the samples it ran (its grid: cap = n * max_det), so a part batch's
        # scores and classes start earlier than a full batch's (read at the full batch's offsets, a part batch
        # had its boxes right and every score 0.0 and class 0: seen on the H100).
        cap = n * self.max_det
        pad = self._batch_pad
        floats = self.host[pad:pad + cap * 5].view(np.float32)
        return split_packed(self.host[:n].tolist(), floats[:cap * 4].reshape(cap, 4), floats[cap * 4:],
                            self.host[pad + cap * 5:pad + cap * 6], self.names, self._empty)

    def close(self) -> None:
        with self.device.active():
            for buf in (self._kept, self._kept_count, self._finished, self._table_dev, self._out_dev, self._allowed):
                if buf is not None:
                    buf.free()
            self._out_dev = None
            self._allowed = None
            self.host = np.empty((0,), np.int32)


def split_packed(counts: Sequence[int], xyxy: np.ndarray, conf: np.ndarray, cls: np.ndarray,
                 names: tuple[str, ...], empty: Detections) -> tuple[list[Detections | None], list[int]]:
    """Cut the NMS kernel's packed output into one :class:`Detections` per sample: sample ``k`` has ``counts[k]``
    boxes after those of the samples before it (``empty`` for 0; None for a negative count ``-n``: its ``n``
    candidates overflowed, and ``n`` is in the second list). The arrays are copied once for the batch (the
    buffers are refilled by the next batch, the detections live on in sinks and trackers); each frame's arrays
    are views of those copies."""
    overflowed = [-c for c in counts if c < 0]
    total = sum(c for c in counts if c > 0)
    if not total:
        return [empty if c >= 0 else None for c in counts], overflowed
    boxes = xyxy[:total].copy()
    scores = conf[:total].copy()
    classes = cls[:total].copy()
    out: list[Detections | None] = []
    a = 0
    for c in counts:
        if c > 0:
            b = a + c
            out.append(Detections.trusted(boxes[a:b], scores[a:b], classes[a:b], names))
            a = b
        else:
            out.append(empty if c == 0 else None)
    return out, overflowed
