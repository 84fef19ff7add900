"""End-to-end outputs [1, N, 6]: x1, y1, x2, y2, score, class (YOLOv10-style, NMS-included exports).

The model has done NMS already; the decoder applies the confidence threshold, the class filter and
``max_det``, and maps the boxes back to the frame. Rows past the real detections are zero-padded by
such exports and fall below any positive threshold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from edgert.config import DecodeConfig
from edgert.errors import ModelError
from edgert.types import TensorSpec
from edgert.vision.decoders._common import SingleOutputDecoder, meta_flag, no_match
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform

__all__ = ["End2EndDecoder"]


#: An end-to-end output keeps at most this many rows; a [1,N,6] output with more is YOLOv5 with one class.
END2END_MAX_ROWS = 1000


class End2EndDecoder(SingleOutputDecoder):
    kind = "end2end"

    @classmethod
    def fits(cls, a: int | None, b: int | None, metadata: Mapping[str, str]) -> bool:
        return b == 6 and (
            meta_flag(metadata, "end2end") or meta_flag(metadata, "nms") or a is None or a <= END2END_MAX_ROWS
        )

    @classmethod
    def num_classes(cls, specs: Sequence[TensorSpec], a: int | None, b: int | None) -> int | None:
        if b != 6:
            raise no_match(specs, "decode.kind end2end needs [1,N,6]")
        return None

    def __init__(self, config: DecodeConfig, names: tuple[str, ...], output: str) -> None:
        super().__init__(config, names, output)

    def __call__(self, outputs: Mapping[str, np.ndarray], transform: LetterboxTransform) -> Detections:
        out = self._output(outputs, self.output)
        if out.ndim != 3 or out.shape[2] != 6:
            raise ModelError(
                f"end2end decoder: output {self.output} has shape {list(out.shape)}. Note: expected [1,N,6]"
            )
        a = out[0]
        idx = np.flatnonzero(a[:, 4] > self._conf)
        if not idx.size:
            return self._empty
        rows = a[idx].astype(np.float32)
        xyxy = np.ascontiguousarray(rows[:, :4])
        return self._finish(xyxy, rows[:, 4].copy(), np.rint(rows[:, 5]).astype(np.int32), transform, run_nms=False)
