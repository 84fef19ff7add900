"""What every decoder shares: class names, output-shape helpers, and the common finishing steps.

A decoder is not re-entrant (it keeps scratch buffers between calls): use one per thread.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgert.coco import COCO_NAMES
from edgert.config import DecodeConfig
from edgert.decoder_kinds import DECODERS
from edgert.errors import ModelError
from edgert.types import Dim, TensorSpec
from edgert.vision.detections import Detections
from edgert.vision.nms import nms_batched
from edgert.vision.preprocess import LetterboxTransform

__all__ = ["DecoderBase", "describe_outputs", "fixed", "parse_names", "resolve_names"]

log = logging.getLogger(__name__)


def fixed(d: Dim) -> int | None:
    return d if isinstance(d, int) and d >= 0 else None


def describe_outputs(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(s.describe() for s in specs) or "(none)"


def parse_names(raw: str | None) -> tuple[str, ...] | None:
    """Class names from Ultralytics metadata: ``"{0: 'Normal', 1: 'Fall'}"`` (or a list literal)."""
    if not raw:
        return None
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        log.warning("ignoring unreadable 'names' metadata %.60r", raw)
        return None
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    if isinstance(value, dict):
        try:
            table = {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError):
            log.warning("ignoring 'names' metadata with non-numeric keys %.60r", raw)
            return None
        if not table or min(table) < 0:
            return None
        return tuple(table.get(i, f"class{i}") for i in range(max(table) + 1))
    log.warning("ignoring 'names' metadata of type %s", type(value).__name__)
    return None


def resolve_names(config: DecodeConfig, metadata: Mapping[str, str], num_classes: int | None) -> tuple[str, ...]:
    """config.names, else the model's metadata names, else COCO for 80 classes, else ``class<i>``."""
    names: tuple[str, ...] | None = tuple(config.names) if config.names else parse_names(metadata.get("names"))
    if names is not None:
        if num_classes is not None and len(names) != num_classes:
            log.warning("%d class names for a model with %d classes", len(names), num_classes)
        return names
    if num_classes == 80:
        return COCO_NAMES
    if num_classes:
        return tuple(f"class{i}" for i in range(num_classes))
    return ()


def no_match(specs: Sequence[TensorSpec], why: str = "") -> ModelError:
    kinds = "; ".join(f"{k} {v}" for k, v in ((k, v.outputs) for k, v in DECODERS.items()))
    extra = f" ({why})" if why else ""
    return ModelError(
        f"model outputs {describe_outputs(specs)} match no detection decoder{extra}. "
        f"Note: valid decode.kind values are {kinds}"
    )


def meta_flag(metadata: Mapping[str, str], key: str) -> bool:
    """True when Ultralytics metadata says so, directly (``end2end``) or in the export ``args``."""
    if str(metadata.get(key, "")).strip().lower() == "true":
        return True
    raw = metadata.get("args")
    if raw:
        try:
            args = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return False
        if isinstance(args, dict):
            return bool(args.get(key))
    return False


def single_output(specs: Sequence[TensorSpec]) -> TensorSpec | None:
    """The one rank-3 output (some YOLOv5 exports add raw head outputs of rank 5 beside it)."""
    rank3 = [s for s in specs if len(s.shape) == 3]
    return rank3[0] if len(rank3) == 1 else None


class DecoderBase:
    """Thresholds, class filter, NMS and the mapping back to the frame, shared by the decoders."""

    kind = "?"

    @classmethod
    def recognizes(cls, specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bool:
        """Whether ``decode.kind: auto`` should take this decoder for a model with these outputs."""
        return False

    @classmethod
    def from_outputs(cls, config: DecodeConfig, specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> Any:
        """This decoder for a model with these outputs, or a one-line :class:`ModelError` saying why not."""
        raise no_match(specs, f"decode.kind {cls.kind} cannot be chosen")

    def __init__(self, config: DecodeConfig, names: tuple[str, ...]) -> None:
        self.config = config
        self.names = names
        self._conf = float(config.conf)
        self._classes = None if config.classes is None else np.asarray(config.classes, np.int64)
        self._empty = Detections.empty(names)

    def _finish(
        self,
        xyxy: np.ndarray,
        conf: np.ndarray,
        cls: np.ndarray,
        transform: LetterboxTransform,
        run_nms: bool = True,
    ) -> Detections:
        """Class filter, NMS (unless the model did it), max_det, then map to the original frame.

        ``xyxy`` is (k, 4) float32 in network-input pixels and owned by the caller (mapped in place).
        """
        if run_nms:
            return self._finish_batch(xyxy, conf, cls, np.zeros(conf.shape[0], np.intp), (transform,))[0]
        if self._classes is not None and cls.size:
            keep = np.isin(cls, self._classes)
            xyxy, conf, cls = xyxy[keep], conf[keep], cls[keep]
        if not conf.size:
            return self._empty
        if conf.size > self.config.max_det:
            idx = np.argsort(-conf, kind="stable")[: self.config.max_det]
            xyxy, conf, cls = xyxy[idx], conf[idx], cls[idx]
        transform.to_original(xyxy)
        return Detections(xyxy, conf, cls, self.names)

    def _finish_batch(
        self,
        xyxy: np.ndarray,
        conf: np.ndarray,
        cls: np.ndarray,
        sample: np.ndarray,
        transforms: Sequence[LetterboxTransform],
    ) -> list[Detections]:
        """:meth:`_finish` (with NMS) for the candidates of several frames at once: ``sample`` says whose
        each row is; one NMS call for all of them (:func:`~edgert.vision.nms.nms_batched`), the same
        detections per frame as one ``_finish`` per frame."""
        n = len(transforms)
        if self._classes is not None and cls.size:
            keep = np.isin(cls, self._classes)
            xyxy, conf, cls, sample = xyxy[keep], conf[keep], cls[keep], sample[keep]
        if not conf.size:
            return [self._empty] * n
        num_classes = max(len(self.names), int(cls.max()) + 1)
        idx = nms_batched(xyxy, conf, self.config.iou, None if self.config.agnostic else cls, sample, num_classes,
                          self.config.max_det)
        xyxy, conf, cls, sample = xyxy[idx], conf[idx], cls[idx], sample[idx]
        by_sample = np.argsort(sample, kind="stable")  # keeps best-first order within each frame
        xyxy, conf, cls, sample = xyxy[by_sample], conf[by_sample], cls[by_sample], sample[by_sample]
        if xyxy.dtype.kind != "f":
            xyxy = xyxy.astype(np.float32)
        _to_original_batch(xyxy, sample, transforms)  # every frame's boxes mapped in one go (a copy: in place)
        xyxy = xyxy.astype(np.float32, copy=False)
        conf = conf.astype(np.float32, copy=False)
        cls = cls.astype(np.int32, copy=False)
        bounds = np.searchsorted(sample, np.arange(n + 1)).tolist()
        names = self._empty.names
        out: list[Detections] = []
        for k in range(n):
            a, b = bounds[k], bounds[k + 1]
            out.append(Detections.trusted(xyxy[a:b], conf[a:b], cls[a:b], names) if b > a else self._empty)
        return out

    @staticmethod
    def _output(outputs: Mapping[str, np.ndarray], name: str) -> np.ndarray:
        try:
            return outputs[name]
        except KeyError:
            raise ModelError(f"model output {name} is missing. Note: outputs are {', '.join(outputs)}") from None


def _to_original_batch(xyxy: np.ndarray, sample: np.ndarray, transforms: Sequence[LetterboxTransform]) -> None:
    """:meth:`LetterboxTransform.to_original` for the rows of several frames at once, in place: row ``i`` is
    mapped by ``transforms[sample[i]]``. The same float32 operations in the same order as one call per frame
    (each scalar taken in the boxes' own precision, as NumPy does for a Python float against a float array), so
    the same bits."""
    if not xyxy.shape[0]:
        return
    table = np.asarray([(t.pad_x, t.scale_x, t.pad_y, t.scale_y, t.src_width, t.src_height) for t in transforms],
                       np.float64).astype(xyxy.dtype)[sample]
    xs = xyxy[:, 0::2]
    ys = xyxy[:, 1::2]
    xs -= table[:, 0:1]
    xs /= table[:, 1:2]
    ys -= table[:, 2:3]
    ys /= table[:, 3:4]
    np.clip(xs, 0, table[:, 4:5], out=xs)
    np.clip(ys, 0, table[:, 5:6], out=ys)


def cxcywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    """(4, k) rows cx, cy, w, h -> a new (k, 4) float32 x1, y1, x2, y2."""
    out = np.empty((b.shape[1], 4), np.float32)
    half_w = b[2] * 0.5
    half_h = b[3] * 0.5
    np.subtract(b[0], half_w, out=out[:, 0])
    np.subtract(b[1], half_h, out=out[:, 1])
    np.add(b[0], half_w, out=out[:, 2])
    np.add(b[1], half_h, out=out[:, 3])
    return out


class SingleOutputDecoder(DecoderBase):
    """A decoder of one rank-3 output ``[1, A, B]``: a subclass says which (A, B) it takes (``fits``, for
    ``auto``) and how many classes they carry (``num_classes``, raising :func:`no_match` when they cannot be
    its layout)."""

    def __init__(self, config: DecodeConfig, names: tuple[str, ...], output: str) -> None:
        super().__init__(config, names)
        self.output = output

    @classmethod
    def fits(cls, a: int | None, b: int | None, metadata: Mapping[str, str]) -> bool:
        return False

    @classmethod
    def num_classes(cls, specs: Sequence[TensorSpec], a: int | None, b: int | None) -> int | None:
        """The class count the output dims give (None: dynamic), or a one-line ModelError."""
        return None

    @classmethod
    def recognizes(cls, specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bool:
        single = single_output(specs)
        return single is not None and cls.fits(fixed(single.shape[1]), fixed(single.shape[2]), metadata)

    @classmethod
    def from_outputs(cls, config: DecodeConfig, specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> Any:
        single = single_output(specs)
        if single is None:
            raise no_match(specs, f"decode.kind {cls.kind} needs one rank-3 output")
        classes = cls.num_classes(specs, fixed(single.shape[1]), fixed(single.shape[2]))
        return cls(config, resolve_names(config, metadata, classes), single.name)
