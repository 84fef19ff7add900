"""Which sinks a run opens, and for which source: the one reading of ``sinks`` that the pipeline and the
service unit share.

A shared sink whose URI holds ``{source}`` becomes one sink per source (``out-{source}.mp4`` ->
``out-cam0.mp4``, ``out-door.mp4``); every other shared sink is opened once; a source's own ``sinks`` get
that source's frames only. A source is named by its ``name``, else by its index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from edgert.config import PipelineConfig

__all__ = ["PLACEHOLDER", "config_sinks", "sink_plan", "source_names"]

#: Where a shared sink's URI takes the name of each source.
PLACEHOLDER = "{source}"

T = TypeVar("T")


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
            plan += [(spec.replace(PLACEHOLDER, name), i) for i, name in enumerate(names)]
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
