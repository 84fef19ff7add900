"""Moved to :mod:`edgert.engine.trt_logger` (the runtime logs through it too); this path keeps working."""

from __future__ import annotations

from edgert.engine.trt_logger import make_logger

__all__ = ["make_logger"]
