"""Moved to :mod:`edgert.engine.file` (the runtime reads engine files too); this path keeps working."""

from __future__ import annotations

from edgert.engine.file import EngineFile, read_engine_file, split_ultralytics_header, write_atomic

__all__ = ["EngineFile", "read_engine_file", "split_ultralytics_header", "write_atomic"]
