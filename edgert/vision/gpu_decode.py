"""Decoding on the GPU where it pays: the confidence filter, so only candidate boxes come back.

A YOLOv8-layout output [1, 4+C, N] of nanodet-416 is 1.2 MB and yolov8s-640's [1, 6, 8400] is 200 KB;
the boxes above the threshold are a few hundred bytes. The kernels in ``kernels/decode.cu`` take the
max over classes per anchor on the device and compact the survivors into rows of
``cx, cy, w, h, score, class, anchor`` (one ``atomicAdd`` each), every sample of a batch in one launch;
one small copy (or, zero-copy, none) brings them back, and the host finishes with the CPU decoder's own
steps (class filter, NMS from :mod:`edgert.vision.nms`, mapping to the frame), so results are the same
set as the numpy decoders give on the same output tensor. The GPU slot normally leaves the rows on the device
for :mod:`edgert.vision.gpu_nms` (the same finishing steps on the GPU); the host finishing here is its
reference and the path without it.

Layouts: ``yolov8`` [1, 4+C, N] and ``yolov5`` [1, N, 5+C] with float32 outputs. Anything else
(end2end, EfficientNMS, float16 outputs) is decoded on the host from the full output, as before.
:func:`emulate_filter` is the numpy reference of the kernels (the tests check it against the decoders).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgert.errors import ModelError
from edgert.vision.decoders import Decoder
from edgert.vision.decoders._common import cxcywh_to_xyxy
from edgert.vision.detections import Detections
from edgert.vision.gpu_preprocess import kernel_source
from edgert.vision.preprocess import LetterboxTransform

__all__ = [
    "CAND_COLS",
    "GPU_DECODE_KINDS",
    "GpuCandidateFilter",
    "candidates_to_detections",
    "candidates_to_detections_batch",
    "emulate_filter",
    "filter_layout",
]

log = logging.getLogger(__name__)

#: floats per candidate row: cx, cy, w, h, score, class, anchor index, unused
CAND_COLS = 8
#: header row (the count in its first int32), then the candidate rows
HEADER_ROWS = 1
GPU_DECODE_KINDS = ("yolov8", "yolov5")
_THREADS = 256


def filter_layout(kind: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """``(num_classes, num_anchors)`` of a yolov8 [1,4+C,N] or yolov5 [1,N,5+C] output shape."""
    if len(shape) != 3 or shape[0] != 1:
        raise ModelError(f"GPU decoding needs a [1, A, B] output, got {list(shape)}")
    if kind == "yolov8":
        if shape[1] < 5:
            raise ModelError(f"yolov8 GPU decoding needs [1,4+C,N] with C >= 1, got {list(shape)}")
        return int(shape[1]) - 4, int(shape[2])
    if kind == "yolov5":
        if shape[2] < 6:
            raise ModelError(f"yolov5 GPU decoding needs [1,N,5+C] with C >= 1, got {list(shape)}")
        return int(shape[2]) - 5, int(shape[1])
    raise ModelError(f"GPU decoding supports {', '.join(GPU_DECODE_KINDS)}, not {kind}")


def emulate_filter(output: np.ndarray, kind: str, conf: float) -> np.ndarray:
    """The filter kernels in numpy: (k, CAND_COLS) float32 rows in anchor order (the documented reference).

    Same operations as ``decode.cu``: float32 max over classes with the first maximum winning
    (yolov8); objectness test, float32 ``cls * obj`` products, then the score test (yolov5).
    """
    out = np.asarray(output, np.float32)
    _, n = filter_layout(kind, out.shape)
    thr = np.float32(conf)
    if kind == "yolov8":
        a = out[0]
        scores = a[4:]
        best = scores.max(axis=0)
        cls = scores.argmax(axis=0)
        idx = np.flatnonzero(best > thr)
        boxes = a[:4, idx].T
    else:
        a = out[0]
        obj_ok = np.flatnonzero(a[:, 4] > thr)
        prod = a[obj_ok, 5:] * a[obj_ok, 4:5]
        cls_all = prod.argmax(axis=1)
        best_all = prod[np.arange(prod.shape[0]), cls_all]
        keep = best_all > thr
        idx = obj_ok[keep]
        best = np.zeros(n, np.float32)
        cls = np.zeros(n, np.int64)
        best[idx] = best_all[keep]
        cls[idx] = cls_all[keep]
        boxes = a[idx, :4]
    rows = np.zeros((idx.shape[0], CAND_COLS), np.float32)
    rows[:, :4] = boxes
    rows[:, 4] = best[idx]
    rows[:, 5] = cls[idx]
    rows[:, 6] = idx
    return rows


def candidates_to_detections(rows: np.ndarray, decoder: Decoder, transform: LetterboxTransform) -> Detections:
    """Finish one frame on the host (:func:`candidates_to_detections_batch` of one)."""
    return candidates_to_detections_batch([rows], decoder, [transform])[0]


def candidates_to_detections_batch(
    rows: Sequence[np.ndarray], decoder: Decoder, transforms: Sequence[LetterboxTransform]
) -> list[Detections]:
    """Finish a batch on the host: anchor order, xyxy, then the decoder's own class filter, NMS (one call for
    the batch) and mapping; ``rows[k]`` are frame ``k``'s candidate rows."""
    # DecoderBase._finish_batch: the CPU decoders' last step, so both paths share one definition of it
    finish = getattr(decoder, "_finish_batch", None)
    if finish is None:
        raise ModelError(f"decoder {decoder.kind} cannot finish GPU candidates")
    sizes = [r.shape[0] for r in rows]
    if not any(sizes):
        return [Detections.empty(decoder.names) for _ in rows]
    # atomics leave each frame's rows in any order: sort by (frame, anchor)
    ordered = np.concatenate([r[np.argsort(r[:, 6], kind="stable")] for r in rows if r.shape[0]])
    sample = np.repeat(np.arange(len(rows)), sizes)
    return finish_candidates(ordered, sample, decoder, transforms)


def finish_candidates(ordered: np.ndarray, sample: np.ndarray, decoder: Decoder,
                      transforms: Sequence[LetterboxTransform]) -> list[Detections]:
    """The tail of :func:`candidates_to_detections_batch`: ``ordered`` rows sorted by (frame, anchor), ``sample``
    each row's frame (an index into ``transforms``)."""
    finish = getattr(decoder, "_finish_batch", None)
    if finish is None:
        raise ModelError(f"decoder {decoder.kind} cannot finish GPU candidates")
    if not ordered.shape[0]:
        return [Detections.empty(decoder.names) for _ in transforms]
    xyxy = cxcywh_to_xyxy(np.ascontiguousarray(ordered[:, :4].T))
    conf = np.ascontiguousarray(ordered[:, 4])
    cls = ordered[:, 5].astype(np.int32)
    result: list[Detections] = finish(xyxy, conf, cls, sample, transforms)
    return result


class GpuCandidateFilter:
    """The filter kernel, its buffers and the copy back, for one stream (one per pipeline slot).

    One launch filters every sample of a batched output (``batch`` samples at most; sample ``k`` at
    ``output_ptr + k * sample_bytes``), and one copy brings every sample's rows back: the number of
    launches and copies does not grow with the batch. Each sample has its own region of ``capacity``
    rows after a header row that holds its count.

    ``mapped``: the rows and the headers live in mapped page-locked host memory that the kernels write
    directly (zero-copy); otherwise in device memory, copied back with one async copy into a pinned array.
    """

    def __init__(
        self,
        decoder: Decoder,
        output_shape: tuple[int, ...],
        device: Any,
        capacity: int = 1024,
        mapped: bool = False,
        batch: int = 1,
    ) -> None:
        from edgert.backends.cuda import compile_kernels

        kind = getattr(decoder, "kind", "?")
        self.num_classes, self.num_anchors = filter_layout(kind, tuple(output_shape))
        if capacity < 1:
            raise ModelError(f"candidate capacity must be >= 1, got {capacity}")
        if batch < 1:
            raise ModelError(f"candidate filter batch must be >= 1, got {batch}")
        self.decoder = decoder
        self.kind = kind
        self.device = device
        self.capacity = int(capacity)
        self.batch = int(batch)
        self.mapped = mapped
        self.conf = np.float32(decoder.config.conf) if hasattr(decoder, "config") else np.float32(0.25)
        self.overflows = 0
        self._region = HEADER_ROWS + self.capacity  # rows per sample
        self._sample_floats = int(np.prod(output_shape))
        with device.active():
            kernels = compile_kernels(kernel_source("decode.cu"), (f"edgert_filter_{kind}_batch", "edgert_take_counts"))
            self._filter = kernels[f"edgert_filter_{kind}_batch"]
            self._take = kernels["edgert_take_counts"]
            self._counters = device.alloc(4 * self.batch)
            zero = device.pinned_empty((self.batch,), np.int32)
            zero.fill(0)
            stream = device.stream()
            self._counters.copy_from_host_async(zero, stream)
            stream.synchronize()
            self.host = device.pinned_empty((self.batch * self._region, CAND_COLS), np.float32, mapped=mapped)
            self.host.fill(0)
            if mapped:
                self._dev_buf = None
                self._buf_ptr = device.device_pointer_of_mapped(self.host)
            else:
                self._dev_buf = device.alloc(self.host.nbytes)
                self._buf_ptr = self._dev_buf.ptr
        self._blocks = (self.num_anchors + _THREADS - 1) // _THREADS

    @property
    def buf_ptr(self) -> int:
        """Device address of the per-sample regions (header row for the count, then the rows)."""
        return int(self._buf_ptr)

    @property
    def counters_ptr(self) -> int:
        """Device address of the per-sample counters (int32), which the next filter launch expects at 0."""
        return int(self._counters.ptr)

    def enqueue(self, output_ptr: int, stream: Any, count: int = 1, copy_back: bool = True) -> None:
        """Filter the first ``count`` samples of the output at device address ``output_ptr`` and start
        bringing their rows back. ``copy_back=False`` (the GPU NMS, which reads the rows where they are): only
        the filter launch; the caller's next kernel takes the counts from :attr:`counters_ptr` and resets them."""
        from edgert.backends.cuda import copy_dtoh_async

        if not 1 <= count <= self.batch:
            raise ModelError(f"candidate filter of {self.batch} sample(s) cannot take {count}")
        self._filter.launch(
            (self._blocks, count, 1),
            (_THREADS, 1, 1),
            (
                np.uintp(output_ptr),
                np.int64(self._sample_floats),
                np.int32(self.num_classes),
                np.int32(self.num_anchors),
                self.conf,
                np.int32(self.capacity),
                np.uintp(self._counters.ptr),
                np.uintp(self._buf_ptr),
            ),
            stream,
        )
        if not copy_back:
            return
        self._take.launch((1, 1, 1), (max(32, count), 1, 1),
                          (np.uintp(self._counters.ptr), np.uintp(self._buf_ptr), np.int32(count),
                           np.int32(self.capacity)), stream)
        if not self.mapped:
            copy_dtoh_async(self.host[: count * self._region], self._buf_ptr, stream)

    def count(self, k: int = 0) -> int:
        """Anchors of sample ``k`` that passed (after the stream has synchronised); may exceed ``capacity``."""
        return int(self.host[k * self._region].view(np.int32)[0])

    def rows(self, k: int = 0) -> np.ndarray | None:
        """Sample ``k``'s candidate rows (a copy), or None when they overflowed ``capacity``."""
        n = self.count(k)
        if n > self.capacity:
            self.overflows += 1
            if self.overflows == 1:
                log.warning(
                    "%d candidates passed conf %.3g, more than the GPU buffer's %d: decoding those "
                    "frames on the host (raise decode.conf or the capacity)",
                    n,
                    self.conf,
                    self.capacity,
                )
            return None
        start = k * self._region + HEADER_ROWS
        rows: np.ndarray = self.host[start : start + n].copy()
        return rows

    def rows_batch(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Samples ``0..n-1`` at once, in a fixed number of numpy calls (:meth:`rows` per sample cost a tenth of a
        slot thread's time at 16 streams): ``(rows, sample, overflowed)``, the rows of every sample that fit
        sorted by (sample, anchor) -- as :func:`candidates_to_detections_batch` orders them -- each row's sample,
        and a mask of the samples whose candidates overflowed ``capacity``."""
        region = self._region
        counts = self.host[: n * region : region].view(np.int32)[:, 0].astype(np.int64)
        overflowed = counts > self.capacity
        if overflowed.any():
            self.note_overflows(counts[overflowed].tolist())
        sizes = np.where(overflowed, 0, counts)
        total = int(sizes.sum())
        sample = np.repeat(np.arange(n), sizes)
        starts = np.arange(n, dtype=np.int64) * region + HEADER_ROWS
        idx = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes) + np.repeat(starts, sizes)
        rows = self.host[idx]  # a copy
        order = np.lexsort((rows[:, 6], sample))  # stable: as a stable sort by anchor within each sample
        return rows[order], sample[order], overflowed

    def note_overflows(self, counts: Sequence[int]) -> None:
        """Count samples whose candidates (``counts``, when known) overflowed ``capacity``; warn on the first."""
        for count in counts:
            self.overflows += 1
            if self.overflows == 1:
                log.warning("%s candidates passed conf %.3g, more than the GPU buffer's %d: decoding those "
                            "frames on the host (raise decode.conf or the capacity)", count, self.conf,
                            self.capacity)

    def close(self) -> None:
        with self.device.active():
            self._counters.free()
            if self._dev_buf is not None:
                self._dev_buf.free()
            self.host = np.empty((0, CAND_COLS), np.float32)
