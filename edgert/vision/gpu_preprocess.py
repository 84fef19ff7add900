"""Preprocessing on the GPU: one CUDA kernel from the decoded BGR uint8 frame to the model input.

The kernel (``kernels/letterbox.cu``, compiled at run time through pycuda) reads the frame from device
memory (uploaded once from a page-locked staging buffer) or straight from mapped page-locked host
memory (zero-copy), and writes the letterboxed, colour-converted, normalised tensor into the engine's
device input buffer, in one pass: each thread makes one output pixel.

It follows the plan of the CPU :class:`~edgert.vision.preprocess.Preprocessor` exactly (size, layout,
dtype, letterbox geometry, pad value, channel order, ``pixel * scale / std - mean / std``), and its
bilinear resize is OpenCV's ``cv2.resize(INTER_LINEAR)`` for 8-bit images, reproduced bit for bit:
OpenCV resizes uint8 images in fixed point (11-bit weights, an integer horizontal pass, then
``(((b0 * (h0 >> 4)) >> 16) + ((b1 * (h1 >> 4)) >> 16) + 2) >> 2`` vertically), and a float bilinear
kernel would differ from it by up to a few grey levels. The offsets and weights are built on the host
by :func:`linear_tables` with OpenCV's own formulas; :func:`emulate_letterbox` is the numpy reference of
the kernel, checked against cv2 in the tests.

Documented tolerance: the emulation equals ``cv2.resize`` exactly (max abs error 0) on every asset
image and ``vtest.avi`` frame, downscaled and upscaled, at 416, 640 and 1000 (tests/gpu). The tensor
contract is therefore "max abs error 0 against the CPU Preprocessor" for the usual ``x / 255`` input
(measured 0 on the H200 for both detectors, docs/gpu-pipeline.md). With a mean/std the CPU path may
convert with OpenCV's ``addWeighted`` (one rounding of ``x * alpha + beta``) where the kernel rounds
twice, like numpy: at most one float32 ulp (2.4e-7 measured) or one float16 step. Should another OpenCV
build resize differently, the difference is bounded by one grey level, ``scale / std`` in the tensor
(1/255 = 0.0039 with the default scale): the device test reports the measured maximum.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgert._package_data import read_text
from edgert.errors import InputError
from edgert.vision.preprocess import LetterboxTransform, Preprocessor, letterbox_placement

__all__ = [
    "GpuLetterbox",
    "LetterboxPlan",
    "emulate_letterbox",
    "kernel_source",
    "linear_tables",
]

log = logging.getLogger(__name__)

#: OpenCV's INTER_RESIZE_COEF_BITS: bilinear weights are integers out of 2048.
COEF_SCALE = 2048
LAYOUTS = {"NCHW": 0, "NHWC": 1}
DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint8): 2}
BLOCK = (32, 8, 1)
#: int64 columns per sample of the batched kernel's geometry table (letterbox.cu EDGERT_BATCH_COLS)
BATCH_COLS = 8


def kernel_source(name: str) -> str:
    """The text of ``edgert/vision/kernels/<name>`` (shipped as package data)."""
    return read_text("edgert.vision", f"kernels/{name}")


def linear_tables(src_len: int, dst_len: int, channels: int = 1) -> np.ndarray:
    """(dst_len, 4) int32 rows ``(s0 * channels, s1 * channels, w0, w1)``: OpenCV's INTER_LINEAR offsets
    and fixed-point weights for one axis (``cv::resize``, 8-bit path).

    ``fx = float((d + 0.5) * scale - 0.5)``, ``s = floor(fx)``, ``fx -= s``, ``w0 = round((1 - fx) * 2048)``,
    ``w1 = round(fx * 2048)`` in float32, rounding half to even like ``cvRound``; the source indices
    ``s`` and ``s + 1`` are clamped to the image (border replicate) but the weights are *not* reset at
    the edges: with two equal pixels the vertical pass then truncates twice, which is what OpenCV
    (checked: opencv-python 4.x/5.0 wheels) gives in the first and last rows of an upscaled image.
    """
    if src_len <= 0 or dst_len <= 0:
        raise InputError(f"resize: sizes must be positive, got {src_len} -> {dst_len}")
    scale = 1.0 / (dst_len / src_len)  # OpenCV: scale = 1. / inv_scale, inv_scale = dsize / ssize
    d = np.arange(dst_len, dtype=np.float64)
    fx = ((d + 0.5) * scale - 0.5).astype(np.float32)
    s = np.floor(fx).astype(np.int64)
    fx = (fx - s.astype(np.float32)).astype(np.float32)
    w0 = np.rint((np.float32(1.0) - fx) * np.float32(COEF_SCALE)).astype(np.int64)
    w1 = np.rint(fx * np.float32(COEF_SCALE)).astype(np.int64)
    s0 = np.clip(s, 0, src_len - 1)
    s1 = np.clip(s + 1, 0, src_len - 1)
    table = np.stack([s0 * channels, s1 * channels, w0, w1], axis=1).astype(np.int32)
    return np.ascontiguousarray(table)


@dataclass(frozen=True)
class LetterboxPlan:
    """Everything the kernel needs besides the frame: what the CPU Preprocessor would do, as numbers."""

    height: int
    width: int
    layout: str  # "NCHW" | "NHWC"
    dtype: np.dtype
    letterbox: bool
    pad: int
    src_channel: tuple[int, int, int]  # output channel c reads BGR channel src_channel[c]
    alpha: tuple[float, float, float]  # float32 values: scale / std
    beta: tuple[float, float, float]  # float32 values: -mean / std

    @classmethod
    def from_preprocessor(cls, pre: Preprocessor) -> LetterboxPlan:
        cfg = pre.config
        # The same float32 values the CPU path multiplies by (Preprocessor._alpha / _beta).
        alpha = np.array([float(cfg.scale) / s for s in cfg.std], np.float32)
        beta = np.array([-m / s for m, s in zip(cfg.mean, cfg.std)], np.float32)
        return cls(
            height=pre.height,
            width=pre.width,
            layout=pre.layout,
            dtype=np.dtype(pre.input_dtype),
            letterbox=cfg.resize == "letterbox",
            pad=int(cfg.pad_value),
            src_channel=(2, 1, 0) if cfg.color == "rgb" else (0, 1, 2),
            alpha=(float(alpha[0]), float(alpha[1]), float(alpha[2])),
            beta=(float(beta[0]), float(beta[1]), float(beta[2])),
        )

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        if self.layout == "NCHW":
            return (3, self.height, self.width)
        return (self.height, self.width, 3)

    @property
    def kernel_beta(self) -> tuple[float, float, float]:
        """The beta the kernel adds. float16 NCHW: the CPU path adds a Python float to a float16 plane,
        which numpy does in half precision (beta rounded to half first); float16 NHWC adds the float32
        array, in float32. Both then round to half; the kernel adds in float32 and rounds to half."""
        if self.dtype == np.float16 and self.layout == "NCHW":
            return tuple(float(np.float16(b)) for b in self.beta)  # type: ignore[return-value]
        return self.beta

    @property
    def has_beta(self) -> bool:
        return any(b != 0.0 for b in self.beta)

    def geometry(self, src_h: int, src_w: int) -> tuple[int, int, int, int, LetterboxTransform]:
        """``(new_h, new_w, top, left, transform)``: as the CPU Preprocessor places a frame of this size."""
        return letterbox_placement(src_h, src_w, self.height, self.width, self.letterbox)


def emulate_letterbox(frame_bgr: np.ndarray, plan: LetterboxPlan) -> np.ndarray:
    """The kernel, in numpy, element for element: the documented reference of ``letterbox.cu``.

    Returns one sample of ``plan.sample_shape`` / ``plan.dtype``. Slow (int64 arrays); for tests.
    """
    src_h, src_w = frame_bgr.shape[:2]
    new_h, new_w, top, left, _ = plan.geometry(src_h, src_w)
    xt = linear_tables(src_w, new_w, 3)
    yt = linear_tables(src_h, new_h, 1)
    flat = frame_bgr.reshape(src_h, src_w * 3).astype(np.int64)
    canvas = np.full((plan.height, plan.width, 3), plan.pad, np.int64)
    for c in range(3):
        # horizontal pass for every source row: h = S[x0 + c] * a0 + S[x1 + c] * a1
        h = flat[:, xt[:, 0] + c] * xt[:, 2] + flat[:, xt[:, 1] + c] * xt[:, 3]
        h0, h1 = h[yt[:, 0]], h[yt[:, 1]]
        b0, b1 = yt[:, 2:3].astype(np.int64), yt[:, 3:4].astype(np.int64)
        v = (((b0 * (h0 >> 4)) >> 16) + ((b1 * (h1 >> 4)) >> 16) + 2) >> 2
        canvas[top : top + new_h, left : left + new_w, c] = np.clip(v, 0, 255)
    out = np.empty(plan.sample_shape, plan.dtype)
    for c in range(3):
        pix = canvas[:, :, plan.src_channel[c]]
        if plan.dtype == np.uint8:
            val: np.ndarray = pix.astype(np.uint8)
        else:
            val = pix.astype(np.float32) * np.float32(plan.alpha[c])  # rounded to float32, as __fmul_rn
            if plan.dtype == np.float16:
                val = val.astype(np.float16)
                if plan.has_beta:
                    val = (val.astype(np.float32) + np.float32(plan.kernel_beta[c])).astype(np.float16)
            elif plan.has_beta:
                val = val + np.float32(plan.beta[c])
        if plan.layout == "NCHW":
            out[c] = val
        else:
            out[:, :, c] = val
    return out


class GpuLetterbox:
    """The compiled kernel plus per-frame-size tables on the device; one per CUDA device is enough.

    ``__call__`` only enqueues work on the given stream, so it is safe to share between threads as
    long as each thread uses its own stream (the tables are read-only once made; making them takes a
    lock).
    """

    def __init__(self, plan: LetterboxPlan, device: Any) -> None:
        import threading

        from edgert.backends.cuda import compile_kernels

        self.plan = plan
        self.device = device
        with device.active():
            kernels = compile_kernels(kernel_source("letterbox.cu"), ("edgert_letterbox", "edgert_letterbox_batch"))
        self._kernel = kernels["edgert_letterbox"]
        self._batch_kernel = kernels["edgert_letterbox_batch"]
        self._tables: dict[tuple[int, int], tuple[Any, Any, tuple[int, int, int, int], LetterboxTransform]] = {}
        self._lock = threading.Lock()
        p = plan
        self._grid = ((p.width + BLOCK[0] - 1) // BLOCK[0], (p.height + BLOCK[1] - 1) // BLOCK[1], 1)
        self._consts = (
            np.int32(p.height),
            np.int32(p.width),
        )
        self._tail = (
            np.int32(p.pad),
            np.int32(p.src_channel[0]),
            np.int32(p.src_channel[1]),
            np.int32(p.src_channel[2]),
            np.int32(LAYOUTS[p.layout]),
            np.int32(DTYPES[p.dtype]),
            np.int32(1 if p.has_beta else 0),
            np.float32(p.alpha[0]),
            np.float32(p.alpha[1]),
            np.float32(p.alpha[2]),
            np.float32(p.kernel_beta[0]),
            np.float32(p.kernel_beta[1]),
            np.float32(p.kernel_beta[2]),
        )

    def _geometry(self, src_h: int, src_w: int) -> tuple[Any, Any, tuple[int, int, int, int], LetterboxTransform]:
        key = (src_h, src_w)
        entry = self._tables.get(key)
        if entry is not None:
            return entry
        with self._lock:
            entry = self._tables.get(key)
            if entry is None:
                new_h, new_w, top, left, transform = self.plan.geometry(src_h, src_w)
                xt = linear_tables(src_w, new_w, 3)
                yt = linear_tables(src_h, new_h, 1)
                with self.device.active():
                    xbuf = self.device.alloc(xt.nbytes)
                    ybuf = self.device.alloc(yt.nbytes)
                    stream = self.device.stream()
                    host_x = self.device.pinned_empty(xt.shape, np.int32)
                    host_y = self.device.pinned_empty(yt.shape, np.int32)
                    host_x[...] = xt
                    host_y[...] = yt
                    xbuf.copy_from_host_async(host_x, stream)
                    ybuf.copy_from_host_async(host_y, stream)
                    stream.synchronize()
                entry = (xbuf, ybuf, (new_h, new_w, top, left), transform)
                self._tables[key] = entry
        return entry

    def __call__(
        self, src_ptr: int, src_h: int, src_w: int, out_ptr: int, stream: Any, src_pitch: int | None = None
    ) -> LetterboxTransform:
        """Enqueue the kernel: frame at device address ``src_ptr`` -> tensor at ``out_ptr``."""
        if src_h <= 0 or src_w <= 0:
            raise InputError(f"frame | Received an empty image ({src_h}, {src_w}, 3)")
        xbuf, ybuf, (new_h, new_w, top, left), transform = self._geometry(src_h, src_w)
        pitch = 3 * src_w if src_pitch is None else src_pitch
        args = (
            np.uintp(src_ptr),
            np.uintp(xbuf.ptr),
            np.uintp(ybuf.ptr),
            np.uintp(out_ptr),
            np.int32(pitch),
            *self._consts,
            np.int32(top),
            np.int32(left),
            np.int32(new_h),
            np.int32(new_w),
            *self._tail,
        )
        self._kernel.launch(self._grid, BLOCK, args, stream)
        return transform

    def enqueue_batch(self, src_base: int, frames: list[tuple[int, int, int]], params: np.ndarray, params_ptr: int,
                      out_ptr: int, out_stride: int, stream: Any) -> list[LetterboxTransform]:
        """Enqueue one launch for a batch: frame ``k`` is ``frames[k] = (offset, h, w)``, packed BGR at
        ``src_base + offset``, and its tensor goes to ``out_ptr + k * out_stride`` (bytes).

        ``params`` is the caller's page-locked int64 (batch, BATCH_COLS) table and ``params_ptr`` its device
        copy: the geometry of every frame travels in one small upload, not one launch per frame. The caller
        must not refill ``params`` before the stream has passed this upload (a slot synchronises its stream
        once per batch).
        """
        # params is page-locked: the copy only queues, so it keeps the interpreter lock (no wait to get it back)
        from edgert.backends.cuda import copy_htod_async_pinned as copy_htod_async

        transforms = []
        for k, (offset, src_h, src_w) in enumerate(frames):
            if src_h <= 0 or src_w <= 0:
                raise InputError(f"frame | Received an empty image ({src_h}, {src_w}, 3)")
            xbuf, ybuf, (new_h, new_w, top, left), transform = self._geometry(src_h, src_w)
            params[k] = (offset, xbuf.ptr, ybuf.ptr, 3 * src_w, top, left, new_h, new_w)
            transforms.append(transform)
        n = len(frames)
        copy_htod_async(params_ptr, params[:n], stream)
        args = (np.uintp(src_base), np.uintp(params_ptr), np.uintp(out_ptr), np.int64(out_stride), *self._consts,
                *self._tail)
        self._batch_kernel.launch((self._grid[0], self._grid[1], n), BLOCK, args, stream)
        return transforms

    def transform_for(self, src_h: int, src_w: int) -> LetterboxTransform:
        return self.plan.geometry(src_h, src_w)[4]

    def close(self) -> None:
        with self._lock, self.device.active():
            for xbuf, ybuf, _, _ in self._tables.values():
                xbuf.free()
                ybuf.free()
            self._tables.clear()
