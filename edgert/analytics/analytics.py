"""``Analytics``: every rule of a pipeline (counting lines, zones, ...), fed with tracked detections once a frame."""

from __future__ import annotations

from typing import Any

from edgert.analytics import table
from edgert.analytics.geometry import anchor_points
from edgert.analytics.rule import Rule
from edgert.config import AnalyticsConfig
from edgert.errors import InputError
from edgert.vision.detections import Detections

__all__ = ["Analytics"]


class Analytics:
    """The rules of ``config``, one per setting of each row of the rules table, in the table's order.

    ``update`` returns the frame's events (a line's ``line_cross`` before a zone's ``zone_enter`` ...), ``counts``
    every rule's totals by its name.
    """

    def __init__(self, config: AnalyticsConfig) -> None:
        self.config = config
        self.rules: list[Rule] = [row.make(one, config.lost_after) for row in table.RULES
                                  for one in row.settings(config)]

    def update(self, detections: Detections, frame_index: int, timestamp: float) -> list[dict[str, Any]]:
        """Events of this frame, each with its track and class."""
        if detections.track_id is None and self.rules:
            raise InputError("analytics need tracked detections (track_id); add a track section to the config")
        anchors = anchor_points(detections.xyxy, self.config.anchor)
        events: list[dict[str, Any]] = []
        for rule in self.rules:
            events.extend(rule.update(detections, anchors, frame_index, timestamp))
        return events

    def counts(self) -> dict[str, Any]:
        """``{rule name: {class: figures}}``: a line's ``{"in", "out"}``, a zone's ``{"occupancy", "entered",
        "exited", "dwell_s"}``."""
        return {rule.name: rule.counts() for rule in self.rules}
