"""Model outputs -> :class:`~edgert.vision.detections.Detections`.

:func:`make_decoder` picks the decoder from the output shapes and the model's metadata, or takes the
one named in ``decode.kind``:

=============== =========================================== ==========================================
kind            outputs                                     typical source
=============== =========================================== ==========================================
yolov5          [1, N, 5+C]: cx,cy,w,h, objectness, classes YOLOv5/v7, darknet YOLOv3/v4 conversions
yolov8          [1, 4+C, N]: cx,cy,w,h, classes             Ultralytics YOLOv8/v11, NanoDet (converted)
end2end         [1, N, 6]: x1,y1,x2,y2, score, class        YOLOv10, exports with NMS inside
efficient_nms   num_dets, boxes, scores, classes            TensorRT EfficientNMS plugin
=============== =========================================== ==========================================
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from edgert.config import DecodeConfig
from edgert.errors import ModelError
from edgert.types import TensorSpec
from edgert.vision.decoders._common import describe_outputs, fixed, parse_names, resolve_names
from edgert.vision.decoders.efficient_nms import EfficientNmsDecoder
from edgert.vision.decoders.end2end import End2EndDecoder
from edgert.vision.decoders.yolov5 import YoloV5Decoder
from edgert.vision.decoders.yolov8 import YoloV8Decoder
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform

__all__ = [
    "DECODER_KINDS",
    "Decoder",
    "EfficientNmsDecoder",
    "End2EndDecoder",
    "YoloV5Decoder",
    "YoloV8Decoder",
    "make_decoder",
    "parse_names",
    "resolve_names",
]

DECODER_KINDS: dict[str, str] = {
    "yolov5": "[1,N,5+C] with objectness",
    "yolov8": "[1,4+C,N]",
    "end2end": "[1,N,6] x1,y1,x2,y2,score,class",
    "efficient_nms": "num_dets, boxes, scores, classes",
}

#: An end-to-end output keeps at most this many rows; a [1,N,6] output with more is YOLOv5 with one class.
_END2END_MAX_ROWS = 1000


class Decoder(Protocol):
    """Outputs of one inference -> detections in the original frame. Not re-entrant: one per thread."""

    names: tuple[str, ...]
    kind: str
    config: DecodeConfig

    def __call__(self, outputs: Mapping[str, np.ndarray], transform: LetterboxTransform) -> Detections: ...


def _no_match(specs: Sequence[TensorSpec], why: str = "") -> ModelError:
    kinds = "; ".join(f"{k} {v}" for k, v in DECODER_KINDS.items())
    extra = f" ({why})" if why else ""
    return ModelError(
        f"model outputs {describe_outputs(specs)} match no detection decoder{extra}. "
        f"Note: valid decode.kind values are {kinds}"
    )


def _meta_flag(metadata: Mapping[str, str], key: str) -> bool:
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


def _efficient_nms_roles(specs: Sequence[TensorSpec]) -> dict[str, str] | None:
    """Which output is num_dets, boxes, scores, classes; None when the outputs are not that set."""
    if len(specs) != 4:
        return None
    roles: dict[str, str] = {}
    rest: list[TensorSpec] = []
    for s in specs:
        dims = [fixed(d) for d in s.shape]
        if s.shape and dims[-1] == 4 and len(s.shape) == 3:
            roles["boxes"] = s.name
        elif all(d == 1 for d in dims) and len(dims) <= 2:
            roles["num_dets"] = s.name
        elif len(s.shape) == 2:
            rest.append(s)
    if len(rest) != 2 or "boxes" not in roles or "num_dets" not in roles:
        return None
    # scores and classes: by name first, then dtype (classes are integers in newer plugin versions)
    by_name = {("class" in s.name.lower()): s for s in rest}
    if len(by_name) == 2:
        roles["classes"], roles["scores"] = by_name[True].name, by_name[False].name
    else:
        ints = [s for s in rest if s.dtype.kind in "iu"]
        if len(ints) == 1:
            roles["classes"] = ints[0].name
            roles["scores"] = next(s.name for s in rest if s is not ints[0])
        else:
            roles["scores"], roles["classes"] = rest[0].name, rest[1].name  # the plugin's own order
    return roles


def _single_output(specs: Sequence[TensorSpec]) -> TensorSpec | None:
    """The one rank-3 output (some YOLOv5 exports add raw head outputs of rank 5 beside it)."""
    rank3 = [s for s in specs if len(s.shape) == 3]
    return rank3[0] if len(rank3) == 1 else None


def _guess_kind(spec: TensorSpec, metadata: Mapping[str, str]) -> str | None:
    a, b = fixed(spec.shape[1]), fixed(spec.shape[2])
    if b == 6 and (
        _meta_flag(metadata, "end2end") or _meta_flag(metadata, "nms") or a is None or a <= _END2END_MAX_ROWS
    ):
        return "end2end"
    if a is not None and a >= 5 and (b is None or b > a):
        return "yolov8"
    if b is not None and b >= 6 and (a is None or a > b):
        return "yolov5"
    return None


def make_decoder(
    config: DecodeConfig, output_specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None
) -> Decoder:
    """The decoder for a model with these outputs (see the module doc for the kinds)."""
    metadata = metadata or {}
    specs = list(output_specs)
    task = metadata.get("task")
    if task and task != "detect":
        raise ModelError(f"this is an Ultralytics '{task}' model (metadata task); edgert decodes 'detect' models only")
    kind: str = config.kind
    roles = _efficient_nms_roles(specs)
    single = _single_output(specs)
    if kind == "auto":
        if roles is not None:
            kind = "efficient_nms"
        elif single is not None:
            guessed = _guess_kind(single, metadata)
            if guessed is None:
                raise _no_match(specs)
            kind = guessed
        else:
            raise _no_match(specs, "expected one [1,A,B] output or the four EfficientNMS outputs")

    if kind == "efficient_nms":
        if roles is None:
            raise _no_match(specs, "decode.kind efficient_nms needs num_dets [1,1], boxes [1,K,4], scores, classes")
        return EfficientNmsDecoder(config, resolve_names(config, metadata, None), **roles)
    if single is None:
        raise _no_match(specs, f"decode.kind {kind} needs one rank-3 output")
    a, b = fixed(single.shape[1]), fixed(single.shape[2])
    if kind == "end2end":
        if b != 6:
            raise _no_match(specs, "decode.kind end2end needs [1,N,6]")
        return End2EndDecoder(config, resolve_names(config, metadata, None), single.name)
    if kind == "yolov8":
        if a is not None and a < 5:
            raise _no_match(specs, "decode.kind yolov8 needs [1,4+C,N] with C >= 1")
        return YoloV8Decoder(config, resolve_names(config, metadata, None if a is None else a - 4), single.name)
    if kind == "yolov5":
        if b is not None and b < 6:
            raise _no_match(specs, "decode.kind yolov5 needs [1,N,5+C] with C >= 1")
        return YoloV5Decoder(config, resolve_names(config, metadata, None if b is None else b - 5), single.name)
    raise _no_match(specs, f"unknown decode.kind {kind}")
