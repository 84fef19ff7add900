"""Model outputs -> :class:`~edgert.vision.detections.Detections`.

:func:`make_decoder` picks the decoder from the output shapes and the model's metadata, or takes the
one named in ``decode.kind``. The kinds are one table, :data:`edgert.decoder_kinds.DECODERS` (config
validation reads it too); each decoder is its own module here and says itself which outputs it
recognizes (``recognizes``) and how it is built from them (``from_outputs``):

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

import importlib
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from edgert.config import DecodeConfig
from edgert.decoder_kinds import DECODERS
from edgert.errors import ModelError
from edgert.types import TensorSpec
from edgert.vision.decoders._common import DecoderBase, no_match, parse_names, resolve_names, single_output
from edgert.vision.decoders.efficient_nms import EfficientNmsDecoder, output_roles
from edgert.vision.decoders.end2end import End2EndDecoder
from edgert.vision.decoders.yolov5 import YoloV5Decoder
from edgert.vision.decoders.yolov8 import YoloV8Decoder
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform

__all__ = [
    "DECODERS",
    "Decoder",
    "DecoderBase",
    "EfficientNmsDecoder",
    "End2EndDecoder",
    "YoloV5Decoder",
    "YoloV8Decoder",
    "decoder_class",
    "make_decoder",
    "parse_names",
    "resolve_names",
]


class Decoder(Protocol):
    """Outputs of one inference -> detections in the original frame. Not re-entrant: one per thread."""

    names: tuple[str, ...]
    kind: str
    config: DecodeConfig

    def __call__(self, outputs: Mapping[str, np.ndarray], transform: LetterboxTransform) -> Detections: ...


def decoder_class(kind: str) -> type[DecoderBase]:
    """The decoder class registered for ``kind`` in :data:`~edgert.decoder_kinds.DECODERS`."""
    row = DECODERS.get(kind)
    if row is None:
        raise ModelError(f"unknown decode.kind {kind!r}. Note: valid kinds are {', '.join(('auto', *DECODERS))}")
    module_name, cls_name = row.target.split(":")
    cls: type[DecoderBase] = getattr(importlib.import_module(module_name), cls_name)
    return cls


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
    if kind == "auto":
        chosen = next((name for name in list(DECODERS) if decoder_class(name).recognizes(specs, metadata)), None)
        if chosen is None:
            if single_output(specs) is None and output_roles(specs) is None:
                raise no_match(specs, "expected one [1,A,B] output or the four EfficientNMS outputs")
            raise no_match(specs)
        kind = chosen
    if kind not in DECODERS:
        raise no_match(specs, f"unknown decode.kind {kind}")
    decoder: Decoder = decoder_class(kind).from_outputs(config, specs, metadata)
    return decoder
