"""The 80 COCO class names (kept here for ``edgert.vision.coco`` imports; the data lives in :mod:`edgert.coco`)."""

from __future__ import annotations

from edgert.coco import COCO_NAMES

__all__ = ["COCO_NAMES"]
