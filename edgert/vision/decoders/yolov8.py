"""YOLOv8/v11 layout (Ultralytics, and NanoDet converted to it): one output [1, 4+C, N].

Rows 0-3 are cx, cy, w, h in network-input pixels, rows 4.. are per-class scores (no objectness).
The max over classes is taken once into a scratch buffer, then only candidates above the confidence
threshold get any per-box work (argmax, box conversion, NMS).
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

__all__ = ["YoloV8Decoder"]


class YoloV8Decoder(SingleOutputDecoder):
    kind = "yolov8"

    @classmethod
    def fits(cls, a: int | None, b: int | None, metadata: Mapping[str, str]) -> bool:
        return a is not None and a >= 5 and (b is None or b > a)

    @classmethod
    def num_classes(cls, specs: Sequence[TensorSpec], a: int | None, b: int | None) -> int | None:
        if a is not None and a < 5:
            raise no_match(specs, "decode.kind yolov8 needs [1,4+C,N] with C >= 1")
        return None if a is None else a - 4

    def __init__(self, config: DecodeConfig, names: tuple[str, ...], output: str) -> None:
        super().__init__(config, names, output)
        self._scratch: tuple[np.ndarray, np.ndarray] | None = None  # (best score, mask) per anchor

    def __call__(self, outputs: Mapping[str, np.ndarray], transform: LetterboxTransform) -> Detections:
        out = self._output(outputs, self.output)
        if out.ndim != 3 or out.shape[1] < 5:
            raise ModelError(
                f"yolov8 decoder: output {self.output} has shape {list(out.shape)}. Note: expected [1,4+C,N]"
            )
        a = out[0]
        n = a.shape[1]
        if self._scratch is None or self._scratch[0].shape[0] != n or self._scratch[0].dtype != a.dtype:
            self._scratch = (np.empty((n,), a.dtype), np.empty((n,), np.bool_))
        best, mask = self._scratch
        scores = a[4:]
        np.max(scores, axis=0, out=best)
        np.greater(best, self._conf, out=mask)
        idx = np.flatnonzero(mask)
        if not idx.size:
            return self._empty
        cand = scores[:, idx]  # (C, k) copy of the few candidates only
        cls = cand.argmax(axis=0).astype(np.int32)
        conf = best[idx].astype(np.float32)
        xyxy = cxcywh_to_xyxy(a[:4, idx].astype(np.float32, copy=False))
        return self._finish(xyxy, conf, cls, transform)
