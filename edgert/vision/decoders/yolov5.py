"""YOLOv5/v7 layout (and darknet YOLOv3/v4 converted to it): one output [1, N, 5+C].

Columns: cx, cy, w, h (network-input pixels), objectness, C class probabilities; score = obj x cls.
Since a score never exceeds its objectness, rows are filtered on objectness first, with no per-box work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from edgert.config import DecodeConfig
from edgert.errors import ModelError
from edgert.types import TensorSpec
from edgert.vision.decoders._common import (
    DecoderBase,
    cxcywh_to_xyxy,
    fixed,
    no_match,
    resolve_names,
    single_output,
)
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform

__all__ = ["YoloV5Decoder"]


class YoloV5Decoder(DecoderBase):
    kind = "yolov5"

    @classmethod
    def recognizes(cls, specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bool:
        single = single_output(specs)
        if single is None:
            return False
        a, b = fixed(single.shape[1]), fixed(single.shape[2])
        return b is not None and b >= 6 and (a is None or a > b)

    @classmethod
    def from_outputs(cls, config: DecodeConfig, specs: Sequence[TensorSpec],
                     metadata: Mapping[str, str]) -> YoloV5Decoder:
        single = single_output(specs)
        if single is None:
            raise no_match(specs, "decode.kind yolov5 needs one rank-3 output")
        b = fixed(single.shape[2])
        if b is not None and b < 6:
            raise no_match(specs, "decode.kind yolov5 needs [1,N,5+C] with C >= 1")
        return cls(config, resolve_names(config, metadata, None if b is None else b - 5), single.name)

    def __init__(self, config: DecodeConfig, names: tuple[str, ...], output: str) -> None:
        super().__init__(config, names)
        self.output = output
        self._mask: np.ndarray | None = None

    def __call__(self, outputs: Mapping[str, np.ndarray], transform: LetterboxTransform) -> Detections:
        out = self._output(outputs, self.output)
        if out.ndim != 3 or out.shape[2] < 6:
            raise ModelError(
                f"yolov5 decoder: output {self.output} has shape {list(out.shape)}. Note: expected [1,N,5+C]"
            )
        a = out[0]
        n = a.shape[0]
        if self._mask is None or self._mask.shape[0] != n:
            self._mask = np.empty((n,), np.bool_)
        np.greater(a[:, 4], self._conf, out=self._mask)
        idx = np.flatnonzero(self._mask)
        if not idx.size:
            return self._empty
        cand = a[idx].astype(np.float32)  # (k, 5+C) copy of the candidates only
        cls_scores = cand[:, 5:]
        cls_scores *= cand[:, 4:5]
        cls = cls_scores.argmax(axis=1)
        conf = cls_scores[np.arange(cls.shape[0]), cls]
        keep = conf > self._conf
        if not keep.any():
            return self._empty
        xyxy = cxcywh_to_xyxy(cand[keep, :4].T)
        return self._finish(xyxy, conf[keep], cls[keep].astype(np.int32), transform)
