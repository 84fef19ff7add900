"""Decoding on the GPU where it pays: the confidence filter, so only candidate boxes come back.

A YOLOv8-layout output [1, 4+C, N] of nanodet-416 is 1.2 MB and yolov8s-640's [1, 6, 8400] is 200 KB;
the boxes above the threshold are a few hundred bytes. The kernels in ``kernels/decode.cu`` take the
max over classes per anchor on the device and compact the survivors into rows of
``cx, cy, w, h, score, class, anchor`` (one ``atomicAdd`` each); one small copy (or, zero-copy, none)
brings them back, and the host finishes with the CPU decoder's own steps (class filter, NMS from
:mod:`edgert.vision.nms`, mapping to the frame), so results are the same set as the numpy decoders give
on the same output tensor. NMS stays on the CPU: after the filter the candidate count is small.

Layouts: ``yolov8`` [1, 4+C, N] and ``yolov5`` [1, N, 5+C] with float32 outputs. Anything else
(end2end, EfficientNMS, float16 outputs) is decoded on the host from the full output, as before.
:func:`emulate_filter` is the numpy reference of the kernels (the tests check it against the decoders).
"""

from __future__ import annotations

import logging
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
    """Finish on the host: anchor order, xyxy, then the decoder's own class filter, NMS and mapping."""
    if rows.shape[0] == 0:
        return Detections.empty(decoder.names)
    rows = rows[np.argsort(rows[:, 6], kind="stable")]  # atomics leave them in any order
    xyxy = cxcywh_to_xyxy(np.ascontiguousarray(rows[:, :4].T))
    conf = np.ascontiguousarray(rows[:, 4])
    cls = rows[:, 5].astype(np.int32)
    # DecoderBase._finish: the CPU decoders' last step, so both paths share one definition of it
    finish = getattr(decoder, "_finish", None)
    if finish is None:
        raise ModelError(f"decoder {decoder.kind} cannot finish GPU candidates")
    result: Detections = finish(xyxy, conf, cls, transform)
    return result


class GpuCandidateFilter:
    """The filter kernel, its buffers and the copy back, for one stream (one per pipeline slot).

    ``mapped``: the rows and the header live in mapped page-locked host memory that the kernels write
    directly (zero-copy); otherwise in device memory, copied back with one async copy into a pinned array.
    """

    def __init__(
        self, decoder: Decoder, output_shape: tuple[int, ...], device: Any, capacity: int = 1024, mapped: bool = False
    ) -> None:
        from edgert.backends.cuda import compile_kernels

        kind = getattr(decoder, "kind", "?")
        self.num_classes, self.num_anchors = filter_layout(kind, tuple(output_shape))
        if capacity < 1:
            raise ModelError(f"candidate capacity must be >= 1, got {capacity}")
        self.decoder = decoder
        self.kind = kind
        self.device = device
        self.capacity = int(capacity)
        self.mapped = mapped
        self.conf = np.float32(decoder.config.conf) if hasattr(decoder, "config") else np.float32(0.25)
        self.overflows = 0
        rows = HEADER_ROWS + self.capacity
        with device.active():
            kernels = compile_kernels(kernel_source("decode.cu"), (f"edgert_filter_{kind}", "edgert_take_count"))
            self._filter = kernels[f"edgert_filter_{kind}"]
            self._take = kernels["edgert_take_count"]
            self._counter = device.alloc(4)
            zero = device.pinned_empty((1,), np.int32)
            zero[0] = 0
            stream = device.stream()
            self._counter.copy_from_host_async(zero, stream)
            stream.synchronize()
            self.host = device.pinned_empty((rows, CAND_COLS), np.float32, mapped=mapped)
            self.host.fill(0)
            if mapped:
                self._dev_buf = None
                self._buf_ptr = device.device_pointer_of_mapped(self.host)
            else:
                self._dev_buf = device.alloc(self.host.nbytes)
                self._buf_ptr = self._dev_buf.ptr
        self._header = self.host[0].view(np.int32)
        self._grid = ((self.num_anchors + _THREADS - 1) // _THREADS, 1, 1)

    def enqueue(self, output_ptr: int, stream: Any) -> None:
        """Filter the output at device address ``output_ptr`` and start bringing the rows back."""
        from edgert.backends.cuda import copy_dtoh_async

        rows_ptr = self._buf_ptr + HEADER_ROWS * CAND_COLS * 4
        self._filter.launch(
            self._grid,
            (_THREADS, 1, 1),
            (
                np.uintp(output_ptr),
                np.int32(self.num_classes),
                np.int32(self.num_anchors),
                self.conf,
                np.int32(self.capacity),
                np.uintp(self._counter.ptr),
                np.uintp(rows_ptr),
            ),
            stream,
        )
        self._take.launch((1, 1, 1), (1, 1, 1), (np.uintp(self._counter.ptr), np.uintp(self._buf_ptr)), stream)
        if not self.mapped:
            copy_dtoh_async(self.host, self._buf_ptr, stream)

    def count(self) -> int:
        """Anchors that passed (after the stream has synchronised); may exceed ``capacity``."""
        return int(self._header[0])

    def rows(self) -> np.ndarray | None:
        """The candidate rows (a copy), or None when they overflowed ``capacity``."""
        n = self.count()
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
        rows: np.ndarray = self.host[HEADER_ROWS : HEADER_ROWS + n].copy()
        return rows

    def close(self) -> None:
        with self.device.active():
            self._counter.free()
            if self._dev_buf is not None:
                self._dev_buf.free()
            self.host = np.empty((0, CAND_COLS), np.float32)
