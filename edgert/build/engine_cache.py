"""Moved to :mod:`edgert.engine.sidecar` (the runtime checks sidecars too); this path keeps working."""

from __future__ import annotations

from edgert.engine.sidecar import (
    SIDECAR_VERSION,
    EngineRecord,
    cached_engine_matches,
    check_loadable,
    compare,
    now_iso,
    read_sidecar,
    sidecar_path,
    write_sidecar,
)

__all__ = [
    "SIDECAR_VERSION",
    "EngineRecord",
    "cached_engine_matches",
    "check_loadable",
    "compare",
    "now_iso",
    "read_sidecar",
    "sidecar_path",
    "write_sidecar",
]
