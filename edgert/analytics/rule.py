"""What every analytics rule is (a counting line, a zone, the next one): the protocol and its table row.

A rule is fed the tracked detections of each frame with their anchor points and returns the frame's events;
``counts()`` is its running totals per class (``{class: {figure: number}}``). Its :class:`RuleKind` row says
the rest once: where its settings sit in ``analytics:``, the ``edgert run`` flag that adds one, how the run
summary words its counts, how a frame shows it and which Prometheus series it feeds. The summary, the
metrics endpoint, the drawing and the flags ask the rows of :data:`edgert.analytics.table.RULES`; adding a
rule is one module and one row there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from edgert.config import AnalyticsConfig
from edgert.vision.detections import Detections

__all__ = ["Rule", "RuleKind", "RuleMetric"]

class Rule(Protocol):
    """One configured rule (a line, a zone) over the tracked detections of one source."""

    name: str

    def update(self, detections: Detections, anchors: np.ndarray, frame_index: int,
               timestamp: float) -> list[dict[str, Any]]: ...

    def counts(self) -> dict[str, dict[str, Any]]: ...


@dataclass(frozen=True)
class RuleMetric:
    """A Prometheus series family a rule kind feeds from its counts.

    Each class's figure ``figures[0]`` becomes one sample labelled source, rule name and class; with ``split``
    every figure present becomes a sample with that label set to the figure's name (a line's crossings:
    ``direction="in"`` and ``"out"``).
    """

    name: str
    help: str
    kind: str  # counter or gauge
    figures: tuple[str, ...]
    split: str | None = None


@dataclass(frozen=True)
class RuleKind:
    """One kind of analytics rule: a row of :data:`edgert.analytics.table.RULES`."""

    kind: str  # the word the summary, errors and metric labels use: line, zone
    field: str  # the field of AnalyticsConfig that holds its settings: lines, zones
    points: str  # the attribute of one setting that holds its coordinates: points, polygon
    make: Callable[[Any, int], Rule]  # (its settings, frames a track may go unseen) -> the rule
    owns: Callable[[Mapping[str, Any]], bool]  # whether one class's figures in a counts table are this kind's
    text: Callable[[Mapping[str, Mapping[str, Any]]], str]  # one rule's counts as the run summary words them
    #: (BGR frame, settings in pixels, counts): the rule drawn in place
    draw: Callable[[np.ndarray, Any, Mapping[str, Mapping[str, Any]]], None]
    metrics: tuple[RuleMetric, ...] = ()
    flag: str | None = None  # the edgert run flag that adds one (--line)
    parse: Callable[[str], Any] | None = None  # the flag's text as its settings

    def settings(self, config: AnalyticsConfig) -> Sequence[Any]:
        """This kind's settings in ``config``."""
        return tuple(getattr(config, self.field))
