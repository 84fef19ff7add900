"""The analytics rules table: one :class:`~edgert.analytics.rule.RuleKind` row per kind of rule.

Everything that handles rules without knowing which they are reads these rows: :class:`Analytics` builds the
rules of a config, :func:`resolve_rules` checks them against a source's frame, :func:`with_rules` adds those
of ``--line`` / ``--zone``, :func:`draw_rules` shows them, :func:`kind_of` tells the summary and the metrics
endpoint whose counts a table holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgert.analytics import lines, zones
from edgert.analytics.rule import RuleKind, RuleMetric
from edgert.analytics.rules import check_classes, is_normalized, on_frame, parse_line, parse_zone
from edgert.config import AnalyticsConfig, FieldError
from edgert.errors import ConfigError

__all__ = ["RULES", "draw_rules", "kind_of", "resolve_rules", "with_rules"]

RULES: list[RuleKind] = [
    RuleKind("line", "lines", "points", lines.LineCounter, lines.owns, lines.text, lines.draw,
             (RuleMetric("edgert_line_crossings_total", "Tracks that crossed a counting line, by direction.",
                         "counter", ("in", "out"), split="direction"),),
             flag="--line", parse=parse_line),
    RuleKind("zone", "zones", "polygon", zones.ZoneMonitor, zones.owns, zones.text, zones.draw,
             (RuleMetric("edgert_zone_occupancy", "Tracks now inside a zone.", "gauge", ("occupancy",)),
              RuleMetric("edgert_zone_entries_total", "Tracks that entered a zone.", "counter", ("entered",)),
              RuleMetric("edgert_zone_exits_total", "Tracks that left a zone (or were lost in it).", "counter",
                         ("exited",)),
              RuleMetric("edgert_zone_dwell_seconds_total", "Seconds spent in a zone by tracks that left it.",
                         "counter", ("dwell_s",))),
             flag="--zone", parse=parse_zone),
]


def kind_of(counts: Mapping[str, Mapping[str, Any]]) -> RuleKind | None:
    """The row whose rule made ``counts`` (``{class: figures}``); None for an empty table or an unknown kind."""
    first = next(iter(counts.values()), None)
    if first is None:
        return None
    return next((row for row in RULES if row.owns(first)), None)


def _fields() -> list[RuleKind]:
    """One row per config field (two kinds may read the same settings)."""
    seen: dict[str, RuleKind] = {}
    for row in RULES:
        seen.setdefault(row.field, row)
    return list(seen.values())


def resolve_rules(config: AnalyticsConfig, width: int, height: int, names: Sequence[str] = (),
                  source: str = "?") -> AnalyticsConfig:
    """``config`` for one source of ``width`` x ``height``: normalised coordinates scaled to pixels, every
    point checked to lie on the frame and every class filter against the model's ``names``."""
    if not config.enabled:
        return config
    sized = bool(width and height)
    changes: dict[str, Any] = {}
    for row in _fields():
        settings = row.settings(config)
        if not sized:
            for one in settings:
                if is_normalized(getattr(one, row.points)):
                    raise ConfigError(f"analytics: {row.kind} {one.name}: 0..1 coordinates need the frame size, "
                                      f"and source {source} does not report one. Note: give pixel coordinates")
        out = []
        for one in settings:
            check_classes(row.kind, one.name, one.classes, names)
            points = getattr(one, row.points)
            if sized:
                points = on_frame(row.kind, one.name, points, width, height, source)
            out.append(dataclasses.replace(one, **{row.points: points}))
        changes[row.field] = tuple(out)
    return dataclasses.replace(config, **changes)


def with_rules(config: AnalyticsConfig, flag: str, texts: Sequence[str]) -> AnalyticsConfig:
    """``config`` with the rules of a flag (``--line``, ``--zone``) added after its own."""
    for row in RULES:
        if row.flag == flag and row.parse is not None:
            parse = row.parse
            break
    else:
        raise ConfigError(f"{flag}: no analytics rule is added by this flag")
    try:
        added: dict[str, Any] = {row.field: (*row.settings(config), *(parse(t) for t in texts))}
        return dataclasses.replace(config, **added)
    except FieldError as exc:  # a name given twice, across the config and the flags
        raise ConfigError(f"{flag}: {exc.message}") from None


def draw_rules(frame_bgr: np.ndarray, config: AnalyticsConfig, counts: Mapping[str, Any] | None) -> None:
    """Every rule of ``config`` (settings in pixels) drawn onto ``frame_bgr`` in place, with its counts."""
    counts = counts or {}
    for row in reversed(RULES):  # zones under lines: a line across a zone stays visible
        for one in row.settings(config):
            row.draw(frame_bgr, one, counts.get(one.name, {}))
