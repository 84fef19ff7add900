"""Vision: preprocessing, YOLO decoding, NMS, drawing, and the one-frame :class:`Detector`.

Importing this package needs numpy alone; OpenCV is imported when a frame is first processed.
"""

from __future__ import annotations

from edgert.coco import COCO_NAMES
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.detections import Detections
from edgert.vision.detector import Detector
from edgert.vision.preprocess import LetterboxTransform, Preprocessor

__all__ = [
    "COCO_NAMES",
    "Decoder",
    "Detections",
    "Detector",
    "LetterboxTransform",
    "Preprocessor",
    "make_decoder",
]
