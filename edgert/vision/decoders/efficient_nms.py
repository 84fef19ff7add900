"""TensorRT EfficientNMS plugin outputs: num_dets [1,1], boxes [1,K,4] (x1,y1,x2,y2), scores [1,K], classes [1,K].

As DeepStream-Yolo and TensorRT's own YOLO samples attach it. Only the first ``num_dets`` rows are real.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgert.config import DecodeConfig
from edgert.vision.decoders._common import DecoderBase
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform

__all__ = ["EfficientNmsDecoder"]


class EfficientNmsDecoder(DecoderBase):
    kind = "efficient_nms"

    def __init__(
        self, config: DecodeConfig, names: tuple[str, ...], num_dets: str, boxes: str, scores: str, classes: str
    ) -> None:
        super().__init__(config, names)
        self.num_dets, self.boxes, self.scores, self.classes = num_dets, boxes, scores, classes

    def __call__(self, outputs: Mapping[str, np.ndarray], transform: LetterboxTransform) -> Detections:
        num = self._output(outputs, self.num_dets)
        boxes = self._output(outputs, self.boxes).reshape(-1, 4)
        scores = self._output(outputs, self.scores).reshape(-1)
        classes = self._output(outputs, self.classes).reshape(-1)
        n = int(num.reshape(-1)[0]) if num.size else 0
        n = max(0, min(n, boxes.shape[0], scores.shape[0], classes.shape[0]))
        if n == 0:
            return self._empty
        idx = np.flatnonzero(scores[:n] > self._conf)
        if not idx.size:
            return self._empty
        xyxy = boxes[idx].astype(np.float32)
        conf = scores[idx].astype(np.float32)
        cls = np.rint(classes[idx]).astype(np.int32) if classes.dtype.kind == "f" else classes[idx].astype(np.int32)
        return self._finish(xyxy, conf, cls, transform, run_nms=False)
