"""The detection decoders, by ``decode.kind``: the one table that config validation (at load, with the
file and line), the decoder choice (:func:`edgert.vision.decoders.make_decoder`, which tries the kinds in
this order for ``auto``) and the no-match error read.

It sits on the foundation floor beside :mod:`edgert.config`, so a config can be checked without importing
vision. To add a decoder: write ``edgert/vision/decoders/NAME.py`` (a ``DecoderBase`` subclass with
``recognizes`` and ``from_outputs``) and add one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DECODERS", "DecoderKind", "decode_kinds", "register_decoder"]


@dataclass(frozen=True)
class DecoderKind:
    """Where a decoder lives (``"module:Class"``, imported when first used) and the outputs it reads."""

    target: str
    outputs: str


#: decode.kind -> decoder, in the order ``auto`` tries them: a model's outputs go to the first that
#: recognizes them (the four EfficientNMS outputs; then one rank-3 output: end-to-end [1,N,6] before the
#: YOLO layouts, which a [1,N,6] output would also fit).
DECODERS: dict[str, DecoderKind] = {
    "efficient_nms": DecoderKind("edgert.vision.decoders.efficient_nms:EfficientNmsDecoder",
                                 "num_dets, boxes, scores, classes"),
    "end2end": DecoderKind("edgert.vision.decoders.end2end:End2EndDecoder", "[1,N,6] x1,y1,x2,y2,score,class"),
    "yolov8": DecoderKind("edgert.vision.decoders.yolov8:YoloV8Decoder", "[1,4+C,N]"),
    "yolov5": DecoderKind("edgert.vision.decoders.yolov5:YoloV5Decoder", "[1,N,5+C] with objectness"),
}


def decode_kinds() -> tuple[str, ...]:
    """Every value ``decode.kind`` accepts, ``auto`` first."""
    return ("auto", *DECODERS)


def register_decoder(kind: str, row: DecoderKind) -> None:
    """Add a decoder kind (a plugin, a test); ``auto`` tries it after the built-in ones."""
    if kind in DECODERS or kind == "auto":
        raise ValueError(f"a decoder kind named {kind!r} is registered already")
    DECODERS[kind] = row
