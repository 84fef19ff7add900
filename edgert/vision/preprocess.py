"""Frame -> model input, written straight into a preallocated buffer (usually ``session.inputs[name]``).

Per frame: one ``cv2.resize`` into a scratch image made once, a copy into the middle of a padded
canvas (the padding is painted once per frame size, not per frame), then colour order, layout, scale,
mean/std and dtype: for NCHW one ``cv2.split`` into three scratch planes and one ``cv2.addWeighted``
per plane written straight into the output channel; for NHWC one ``cvtColor`` and one arithmetic pass.
Each output channel c is ``(pixel * scale - mean[c]) / std[c]``, with mean/std in the model's colour
order. Nothing is allocated per frame once the frame size is known (docs/results/README.md
measures it with tracemalloc): the same :class:`LetterboxTransform` object is returned for every frame
of one size.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.config import PreprocessConfig
from edgert.errors import ConfigError, InputError, ModelError
from edgert.types import TensorSpec

__all__ = ["LetterboxTransform", "Preprocessor", "check_frame", "letterbox_geometry", "letterbox_placement",
           "model_image_size"]

log = logging.getLogger(__name__)

_FRAME_NOTE = "Note: expected an HxWx3 uint8 BGR image"


def check_frame(frame_bgr: Any) -> tuple[int, int]:
    """``(height, width)`` of an HxWx3 uint8 BGR frame, or a one-line InputError saying what it is instead
    (both processors' first step)."""
    if not isinstance(frame_bgr, np.ndarray) or frame_bgr.ndim != 3 or frame_bgr.shape[2] != 3:
        got = frame_bgr.shape if isinstance(frame_bgr, np.ndarray) else type(frame_bgr).__name__
        raise InputError(f"frame | Received {got}. {_FRAME_NOTE}")
    if frame_bgr.dtype != np.uint8:
        raise InputError(f"frame | Received dtype {frame_bgr.dtype}. {_FRAME_NOTE}")
    if frame_bgr.shape[0] == 0 or frame_bgr.shape[1] == 0:
        raise InputError(f"frame | Received an empty image {frame_bgr.shape}. {_FRAME_NOTE}")
    return int(frame_bgr.shape[0]), int(frame_bgr.shape[1])


@dataclass(frozen=True)
class LetterboxTransform:
    """How a frame was placed in the network input: ``input = original * scale + pad``."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    src_width: int
    src_height: int

    def to_original(self, xyxy: np.ndarray) -> np.ndarray:
        """Map (N, 4) network-input boxes back to original-frame pixels, clipped to the frame.

        Works in place on float arrays (and returns them); other dtypes are converted to float32 first.
        """
        if xyxy.dtype.kind != "f":
            xyxy = xyxy.astype(np.float32)
        if xyxy.size == 0:
            return xyxy
        xs = xyxy[..., 0::2]
        ys = xyxy[..., 1::2]
        xs -= self.pad_x
        xs /= self.scale_x
        ys -= self.pad_y
        ys /= self.scale_y
        np.clip(xs, 0, self.src_width, out=xs)
        np.clip(ys, 0, self.src_height, out=ys)
        return xyxy

    def to_input(self, xyxy: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`to_original` (original-frame boxes -> network input), as a new array."""
        out = np.array(xyxy, dtype=np.float32, copy=True)
        out[..., 0::2] = out[..., 0::2] * self.scale_x + self.pad_x
        out[..., 1::2] = out[..., 1::2] * self.scale_y + self.pad_y
        return out


def letterbox_geometry(
    src_h: int, src_w: int, dst_h: int, dst_w: int, letterbox: bool = True
) -> tuple[int, int, int, int]:
    """``(new_h, new_w, top, left)``: the resized frame's size and where it sits in the input."""
    if not letterbox:
        return dst_h, dst_w, 0, 0
    r = min(dst_h / src_h, dst_w / src_w)
    new_w = max(1, min(dst_w, round(src_w * r)))
    new_h = max(1, min(dst_h, round(src_h * r)))
    return new_h, new_w, (dst_h - new_h) // 2, (dst_w - new_w) // 2


def letterbox_placement(
    src_h: int, src_w: int, dst_h: int, dst_w: int, letterbox: bool = True
) -> tuple[int, int, int, int, LetterboxTransform]:
    """:func:`letterbox_geometry` plus the transform that maps boxes back; the CPU and GPU paths share it."""
    new_h, new_w, top, left = letterbox_geometry(src_h, src_w, dst_h, dst_w, letterbox)
    transform = LetterboxTransform(
        scale_x=new_w / src_w,
        scale_y=new_h / src_h,
        pad_x=float(left),
        pad_y=float(top),
        src_width=src_w,
        src_height=src_h,
    )
    return new_h, new_w, top, left, transform


def model_image_size(metadata: Mapping[str, str] | None) -> tuple[int, int] | None:
    """``(height, width)`` from Ultralytics metadata ``imgsz`` ("[640, 640]" or "640"), if present."""
    raw = (metadata or {}).get("imgsz")
    if not raw:
        return None
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        log.warning("ignoring unreadable imgsz metadata %r", raw)
        return None
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    log.warning("ignoring unreadable imgsz metadata %r", raw)
    return None


def _stride_multiple(
    height: int, width: int, fixed_h: int | None, fixed_w: int | None, metadata: Mapping[str, str] | None
) -> tuple[int, int]:
    """A dynamic-size Ultralytics model needs sides that are multiples of its ``stride``: round up, as it does."""
    raw = (metadata or {}).get("stride", "")
    stride = int(raw) if raw.strip().isdigit() and int(raw) > 0 else 1
    new_h = height if fixed_h is not None else -(-height // stride) * stride
    new_w = width if fixed_w is not None else -(-width // stride) * stride
    if (new_h, new_w) != (height, width):
        log.warning(
            "input size %dx%d rounded up to %dx%d, a multiple of the model's stride %d",
            height,
            width,
            new_h,
            new_w,
            stride,
        )
    return new_h, new_w


def _fixed(d: Any) -> int | None:
    return d if isinstance(d, int) and d > 0 else None


class _Geometry:
    """Scratch buffers and the transform for one source frame size."""

    def __init__(self, src_h: int, src_w: int, dst_h: int, dst_w: int, letterbox: bool) -> None:
        new_h, new_w, top, left, self.transform = letterbox_placement(src_h, src_w, dst_h, dst_w, letterbox)
        self.src = (src_h, src_w)
        self.new = (new_h, new_w)
        self.full = (new_h, new_w) == (dst_h, dst_w)
        self.region = (slice(top, top + new_h), slice(left, left + new_w))
        # resize straight into the canvas when the frame fills it; else into a scratch of the inner size
        self.resized: np.ndarray | None = None if self.full else np.empty((new_h, new_w, 3), np.uint8)


class Preprocessor:
    """Letterbox (or stretch), colour order, scale/mean/std, layout and dtype for one model input.

    ``input_shape`` and ``input_dtype`` say what buffer ``__call__`` fills. ``out`` may be the full
    input (batch 1) or one sample of a batched input (shape without the batch dim).
    """

    def __init__(
        self, config: PreprocessConfig, input_spec: TensorSpec, metadata: Mapping[str, str] | None = None
    ) -> None:
        self._cv2 = lazy_import("cv2", "image preprocessing")
        self.config = config
        self.spec = input_spec
        shape = input_spec.shape
        if len(shape) != 4:
            raise ModelError(
                f"Input tensor: {input_spec.describe()} | not an image input. Note: expected rank 4, NCHW or NHWC"
            )
        self.layout = self._resolve_layout(config, input_spec)
        h_dim, w_dim = (shape[2], shape[3]) if self.layout == "NCHW" else (shape[1], shape[2])
        self.height, self.width = self._resolve_size(config, input_spec, _fixed(h_dim), _fixed(w_dim), metadata)
        self.input_dtype: np.dtype = self._resolve_dtype(config, input_spec)
        batch = _fixed(shape[0]) or 1
        self.input_shape: tuple[int, ...] = (
            (batch, 3, self.height, self.width) if self.layout == "NCHW" else (batch, self.height, self.width, 3)
        )
        self.sample_shape = self.input_shape[1:]

        # out = pixel * alpha + beta per output channel; channel c of the output reads source channel src[c]
        scale = float(config.scale)
        self._alpha = np.array([scale / s for s in config.std], np.float32)
        self._beta = np.array([-m / s for m, s in zip(config.mean, config.std)], np.float32)
        self._identity = bool(np.all(self._alpha == 1.0) and np.all(self._beta == 0.0))
        self._has_beta = bool(np.any(self._beta != 0.0))
        self._uniform = bool(np.all(self._alpha == self._alpha[0]) and np.all(self._beta == self._beta[0]))
        self._src_channel = (2, 1, 0) if config.color == "rgb" else (0, 1, 2)
        if self.input_dtype == np.uint8 and not self._identity:
            raise ConfigError(
                f"preprocess: the model input {input_spec.name} is uint8, so it takes raw pixels. "
                "Note: set scale: 1.0, mean: [0, 0, 0], std: [1, 1, 1]"
            )
        self._letterbox = config.resize == "letterbox"
        self._pad = int(config.pad_value)
        cv2 = self._cv2
        self._interp = cv2.INTER_LINEAR
        # Scratch images, made once: the padded frame (BGR), its three planes (NCHW) or its RGB copy (NHWC).
        h, w = self.height, self.width
        self._canvas = np.empty((h, w, 3), np.uint8)
        self._planes = [np.empty((h, w), np.uint8) for _ in range(3)] if self.layout == "NCHW" else []
        self._rgb = np.empty((h, w, 3), np.uint8) if self.layout == "NHWC" and config.color == "rgb" else None
        self._geom: _Geometry | None = None
        self._alpha_c = [float(a) for a in self._alpha]
        self._beta_c = [float(b) for b in self._beta]
        self._alpha4 = (*self._alpha_c, 0.0)
        self._beta4 = (*self._beta_c, 0.0)
        # OpenCV's arithmetic converts uint8 -> float32/float16 with scale and offset in one SIMD pass,
        # 2-5x faster than numpy here (numpy's float16 casts are slow). Older OpenCV builds lack some
        # float16 arithmetic, so the first frame checks the OpenCV path against numpy and keeps numpy
        # if it fails or differs.
        depth = {np.dtype(np.float32): cv2.CV_32F, np.dtype(np.float16): cv2.CV_16F}.get(self.input_dtype)
        self._cv_depth: int | None = None if self._identity else depth
        self._cv_checked = self._cv_depth is None

    # -- resolution of what the model wants -------------------------------------------------------
    @staticmethod
    def _resolve_layout(config: PreprocessConfig, spec: TensorSpec) -> str:
        if config.layout != "auto":
            want = 1 if config.layout == "NCHW" else 3
            if _fixed(spec.shape[want]) not in (None, 3):
                raise ConfigError(f"preprocess.layout {config.layout} does not fit the model input {spec.describe()}")
            return config.layout
        c1, c3 = _fixed(spec.shape[1]), _fixed(spec.shape[3])
        if c1 == 3:
            return "NCHW"
        if c3 == 3:
            return "NHWC"
        if c1 is None and c3 is None:
            return "NCHW"  # both dynamic: the ONNX convention
        raise ModelError(
            f"Input tensor: {spec.describe()} | no dimension of 3 colour channels. "
            "Note: expected [N,3,H,W] or [N,H,W,3]; set preprocess.layout if the model is unusual"
        )

    @staticmethod
    def _resolve_size(
        config: PreprocessConfig, spec: TensorSpec, h: int | None, w: int | None, metadata: Mapping[str, str] | None
    ) -> tuple[int, int]:
        if config.size is not None:
            ch, cw = int(config.size[0]), int(config.size[1])
            if (h is not None and h != ch) or (w is not None and w != cw):
                raise ConfigError(
                    f"preprocess.size {[ch, cw]} does not fit the model input {spec.describe()}. "
                    f"Note: the model takes {h}x{w} (height x width)"
                )
            return _stride_multiple(ch, cw, h, w, metadata)
        if h is not None and w is not None:
            return h, w
        from_meta = model_image_size(metadata)
        if from_meta is not None:
            return _stride_multiple(from_meta[0], from_meta[1], h, w, metadata)
        raise ConfigError(
            f"the model input {spec.describe()} has no fixed image size. Note: set preprocess.size: [height, width]"
        )

    @staticmethod
    def _resolve_dtype(config: PreprocessConfig, spec: TensorSpec) -> np.dtype:
        if config.dtype == "auto":
            dtype = np.dtype(spec.dtype)
        else:
            dtype = np.dtype(config.dtype)
            if dtype != spec.dtype:
                raise ConfigError(
                    f"preprocess.dtype {config.dtype} does not fit the model input {spec.describe()}. "
                    "Note: use dtype: auto"
                )
        if dtype not in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8)):
            raise ModelError(
                f"Input tensor: {spec.describe()} | dtype {dtype} is not supported. "
                "Note: expected float32, float16 or uint8"
            )
        return dtype

    def allocate(self) -> np.ndarray:
        """A zeroed buffer of ``input_shape``/``input_dtype`` (for callers without a session)."""
        return np.zeros(self.input_shape, self.input_dtype)

    # -- the hot path ---------------------------------------------------------------------------------
    def __call__(self, frame_bgr: np.ndarray, out: np.ndarray) -> LetterboxTransform:
        """Write the model input for one HxWx3 uint8 BGR frame into ``out``; return the transform."""
        check_frame(frame_bgr)
        sample = out[0] if out.shape == self.input_shape and self.input_shape[0] == 1 else out
        if sample.shape != self.sample_shape or out.dtype != self.input_dtype:
            raise InputError(
                f"preprocess output | Received {out.dtype}{list(out.shape)}. "
                f"Note: expected {self.input_dtype}{list(self.input_shape)}"
            )

        geom = self._geom
        h, w = frame_bgr.shape[0], frame_bgr.shape[1]
        if geom is None or geom.src != (h, w):
            geom = self._geom = _Geometry(h, w, self.height, self.width, self._letterbox)
            self._canvas.fill(self._pad)  # padding painted once per frame size
        self._place(frame_bgr, geom)
        self._convert(sample)
        return geom.transform

    def _place(self, frame: np.ndarray, geom: _Geometry) -> None:
        cv2 = self._cv2
        new_h, new_w = geom.new
        if geom.full:
            if frame.shape[0] == new_h and frame.shape[1] == new_w:
                np.copyto(self._canvas, frame)
            else:
                cv2.resize(frame, (new_w, new_h), dst=self._canvas, interpolation=self._interp)
            return
        resized = geom.resized
        if resized is None:  # pragma: no cover - _Geometry makes one whenever not full
            raise RuntimeError("preprocess scratch buffer missing")
        if frame.shape[0] == new_h and frame.shape[1] == new_w:
            np.copyto(resized, frame)
        else:
            cv2.resize(frame, (new_w, new_h), dst=resized, interpolation=self._interp)
        self._canvas[geom.region] = resized

    def _convert(self, sample: np.ndarray) -> None:
        if not self._cv_checked:
            self._check_cv(sample)
            return
        if self.layout == "NCHW":
            self._cv2.split(self._canvas, self._planes)
            for c in range(3):
                self._plane(self._planes[self._src_channel[c]], sample[c], c)
            return
        cv2 = self._cv2
        if self._identity and self._rgb is not None and sample.dtype == np.uint8:
            self._into(sample, cv2.cvtColor(self._canvas, cv2.COLOR_BGR2RGB, dst=sample))  # one pass, no scratch
            return
        src = self._canvas if self._rgb is None else cv2.cvtColor(self._canvas, cv2.COLOR_BGR2RGB, dst=self._rgb)
        if self._identity:
            np.copyto(sample, src, casting="unsafe")
        elif self._cv_depth is None:
            np.multiply(src, self._alpha, out=sample, dtype=np.float32, casting="same_kind")
            if self._has_beta:
                np.add(sample, self._beta, out=sample, casting="same_kind")
        elif self._uniform:
            a, b = self._alpha_c[0], self._beta_c[0]
            self._into(sample, cv2.addWeighted(src, a, src, 0.0, b, dst=sample, dtype=self._cv_depth))
        else:
            self._into(sample, cv2.multiply(src, self._alpha4, dst=sample, dtype=self._cv_depth))
            self._into(sample, cv2.add(sample, self._beta4, dst=sample))

    def _plane(self, src: np.ndarray, dst: np.ndarray, c: int) -> None:
        """One channel: ``dst = src * alpha[c] + beta[c]`` in the output dtype."""
        if self._identity:
            np.copyto(dst, src, casting="unsafe")
        elif self._cv_depth is not None:
            r = self._cv2.addWeighted(src, self._alpha_c[c], src, 0.0, self._beta_c[c], dst=dst, dtype=self._cv_depth)
            self._into(dst, r)
        else:
            np.multiply(src, self._alpha_c[c], out=dst, dtype=np.float32, casting="same_kind")
            if self._beta_c[c] != 0.0:
                np.add(dst, self._beta_c[c], out=dst, casting="same_kind")

    @staticmethod
    def _into(dst: np.ndarray, result: np.ndarray) -> None:
        # OpenCV returns `dst` itself when it could write there; otherwise a new array to copy over.
        if result is not dst:
            np.copyto(dst, result, casting="same_kind")

    def _check_cv(self, sample: np.ndarray) -> None:
        """First frame only: run the OpenCV path, compare with numpy, keep whichever is right."""
        self._cv_checked = True
        depth, self._cv_depth = self._cv_depth, None
        self._convert(sample)  # numpy reference
        reference = sample.astype(np.float32)
        self._cv_depth = depth
        try:
            self._convert(sample)
            ok = np.allclose(sample.astype(np.float32), reference, rtol=2e-3, atol=2e-3)
        except self._cv2.error as exc:
            log.info("OpenCV cannot convert to %s here (%s); using numpy", self.input_dtype, exc)
            ok = False
        if not ok:
            log.info("preprocessing with numpy: OpenCV's %s conversion did not match", self.input_dtype)
            self._cv_depth = None
            self._convert(sample)
