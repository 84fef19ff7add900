"""Reading and writing engine files, plain TensorRT plans and Ultralytics ``.engine`` files alike.

Ultralytics writes ``model.export(format="engine")`` as a 4-byte little-endian length, that many bytes
of JSON metadata (names, imgsz, stride, task, ...), then the serialized plan. A plain plan has no such
prefix. edgert writes plain plans and keeps its own metadata in the sidecar JSON instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgert.atomic_file import replace_file
from edgert.atomic_file import sha256_file as file_sha256
from edgert.errors import EngineCacheError

__all__ = ["EngineFile", "file_sha256", "read_engine_file", "split_ultralytics_header", "write_atomic"]

# Metadata longer than this is not an Ultralytics header: the first bytes of a plan happen to read so.
_MAX_META = 1 << 20


@dataclass(frozen=True)
class EngineFile:
    path: Path
    plan: bytes
    metadata: dict[str, Any] = field(default_factory=dict)  # the Ultralytics header's JSON, when present

    @property
    def is_ultralytics(self) -> bool:
        return bool(self.metadata)


def split_ultralytics_header(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(metadata, plan) when ``data`` starts with an Ultralytics header, else ({}, data)."""
    if len(data) < 6:
        return {}, data
    n = int.from_bytes(data[:4], byteorder="little")
    if not 2 <= n <= min(_MAX_META, len(data) - 4) or data[4:5] != b"{":
        return {}, data
    try:
        meta = json.loads(data[4 : 4 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}, data
    if not isinstance(meta, dict):
        return {}, data
    return meta, data[4 + n :]


def read_engine_file(path: str | Path) -> EngineFile:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise EngineCacheError(f"{p}: engine file not found") from None
    except OSError as exc:
        raise EngineCacheError(f"{p}: cannot read the engine ({exc.strerror})") from exc
    if not data:
        raise EngineCacheError(f"{p}: the engine file is empty; rebuild it with edgert build")
    meta, plan = split_ultralytics_header(data)
    if not plan:
        raise EngineCacheError(f"{p}: the engine file holds metadata but no plan; rebuild it")
    return EngineFile(p, plan, meta)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, so a killed build never leaves half an engine."""
    replace_file(path, data)
