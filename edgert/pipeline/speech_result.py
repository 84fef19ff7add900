"""What the speech chain gives the results stage for one audio chunk: a :class:`Detections` with no boxes and the
events the chunk completed. Apart from :mod:`edgert.pipeline.speech` so that the processor base and the results
stage can name it without importing the chain."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgert.vision.detections import Detections

if TYPE_CHECKING:
    from edgert.pipeline.parts import JSONDict

__all__ = ["SpeechResult"]


class SpeechResult(Detections):
    """One chunk as the results stage sees it: detections with no boxes, and the events the chunk completed."""

    frame_record = False  # sinks write the events, not a record per chunk
    events: list[JSONDict]

    def __init__(self, events: list[JSONDict]) -> None:
        super().__init__(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32))
        object.__setattr__(self, "events", events)  # Detections is frozen
