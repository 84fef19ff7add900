"""TensorRT EfficientNMS plugin outputs: num_dets [1,1], boxes [1,K,4] (x1,y1,x2,y2), scores [1,K], classes [1,K].

As DeepStream-Yolo and TensorRT's own YOLO samples attach it. Only the first ``num_dets`` rows are real.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from edgert.config import DecodeConfig
from edgert.types import TensorSpec
from edgert.vision.decoders._common import DecoderBase, fixed, no_match, resolve_names
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform

__all__ = ["EfficientNmsDecoder"]


def output_roles(specs: Sequence[TensorSpec]) -> dict[str, str] | None:
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



class EfficientNmsDecoder(DecoderBase):
    kind = "efficient_nms"

    @classmethod
    def recognizes(cls, specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bool:
        return output_roles(specs) is not None

    @classmethod
    def from_outputs(cls, config: DecodeConfig, specs: Sequence[TensorSpec],
                     metadata: Mapping[str, str]) -> EfficientNmsDecoder:
        roles = output_roles(specs)
        if roles is None:
            raise no_match(specs, "decode.kind efficient_nms needs num_dets [1,1], boxes [1,K,4], scores, classes")
        return cls(config, resolve_names(config, metadata, None), **roles)

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
