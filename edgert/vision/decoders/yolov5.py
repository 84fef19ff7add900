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
from edgert.vision.decoders._common import SingleOutputDecoder, cxcywh_to_xyxy, no_match
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform

__all__ = ["YoloV5Decoder"]


class YoloV5Decoder(SingleOutputDecoder):
    kind = "yolov5"

    @classmethod
    def fits(cls, a: int | None, b: int | None, metadata: Mapping[str, str]) -> bool:
        return b is not None and b >= 6 and (a is None or a > b)

    @classmethod
    def num_classes(cls, specs: Sequence[TensorSpec], a: int | None, b: int | None) -> int | None:
        if b is not None and b < 6:
            raise no_match(specs, "decode.kind yolov5 needs [1,N,5+C] with C >= 1")
        return None if b is None else b - 5

    def __init__(self, config: DecodeConfig, names: tuple[str, ...], output: str) -> None:
        super().__init__(config, names, output)
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
