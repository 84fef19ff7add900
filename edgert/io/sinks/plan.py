"""Which sinks a run opens, and for which source: the one reading of ``sinks`` that the pipeline and the
service unit share.

A shared sink whose URI holds ``{source}`` becomes one sink per source (``out-{source}.mp4`` ->
``out-cam0.mp4``, ``out-door.mp4``); every other shared sink is opened once; a source's own ``sinks`` get
that source's frames only. A source is named by its ``name``, else by its index.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

from edgert.config import PipelineConfig
from edgert.errors import ConfigError
from edgert.redact import redact

__all__ = ["PLACEHOLDER", "config_sinks", "fill_source", "sink_plan", "source_names"]

#: Where a shared sink's URI takes the name of each source.
PLACEHOLDER = "{source}"

T = TypeVar("T")

# A name that fills {source} in a sink's path or URI: a file name, never a path, a query or a fragment.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


def fill_source(spec: str, name: str) -> str:
    """``spec`` with ``{source}`` replaced by ``name``, refusing a name that would leave the sink's folder
    (``/``, ``..``, an absolute path) or change its options (``?``, ``#``)."""
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"source name {name!r} cannot fill {{source}} in {redact(spec)}: use 1 to 64 letters, "
                          "digits, '_', '-' and '.' (no '/', '..', '?', '#' or blanks)")
    return spec.replace(PLACEHOLDER, name)


def source_names(config: PipelineConfig) -> list[str]:
    """How results, events and sinks name each source of ``config``."""
    return [cfg.name if cfg.name is not None else str(i) for i, cfg in enumerate(config.all_sources())]


def sink_plan(shared: Sequence[T], names: Sequence[str],
              own: Sequence[Sequence[str]]) -> list[tuple[T | str, int | None]]:
    """Every sink of a run as ``(spec, source index or None for a shared sink)``.

    ``shared`` are the run's sinks (URIs or ready sink objects), ``names`` the sources' names, ``own[i]``
    the URIs of source ``i``'s own sinks.
    """
    plan: list[tuple[T | str, int | None]] = []
    for spec in shared:
        if isinstance(spec, str) and PLACEHOLDER in spec:
            plan += [(fill_source(spec, name), i) for i, name in enumerate(names)]
        else:
            plan.append((spec, None))
    for i, specs in enumerate(own):
        plan += [(spec, i) for spec in specs]
    return plan


def config_sinks(config: PipelineConfig) -> list[str]:
    """Every sink URI a run of ``config`` opens, ``{source}`` expanded."""
    sources = config.all_sources()
    plan = sink_plan(config.sinks, source_names(config), [cfg.sinks for cfg in sources])
    return [spec for spec, _ in plan]
