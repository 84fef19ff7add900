"""``Analytics``: every counting line and zone of a pipeline, fed with tracked detections once a frame."""

from __future__ import annotations

from typing import Any

from edgert.analytics.geometry import anchor_points
from edgert.analytics.lines import LineCounter
from edgert.analytics.zones import ZoneMonitor
from edgert.config import AnalyticsConfig
from edgert.errors import InputError
from edgert.vision.detections import Detections

__all__ = ["Analytics"]


class Analytics:
    """Lines and zones of ``config``. ``update`` returns the frame's events, ``counts`` the totals."""

    def __init__(self, config: AnalyticsConfig) -> None:
        self.config = config
        self.lines = [LineCounter(line, config.lost_after) for line in config.lines]
        self.zones = [ZoneMonitor(zone, config.lost_after) for zone in config.zones]

    def update(self, detections: Detections, frame_index: int, timestamp: float) -> list[dict[str, Any]]:
        """Events of this frame: ``line_cross`` then ``zone_enter`` / ``zone_exit``, each with track and class."""
        if detections.track_id is None and (self.lines or self.zones):
            raise InputError("analytics need tracked detections (track_id); add a track section to the config")
        anchors = anchor_points(detections.xyxy, self.config.anchor)
        events: list[dict[str, Any]] = []
        for line in self.lines:
            events.extend(line.update(detections, anchors, frame_index, timestamp))
        for zone in self.zones:
            events.extend(zone.update(detections, anchors, frame_index, timestamp))
        return events

    def counts(self) -> dict[str, Any]:
        """``{line: {class: {"in", "out"}}, zone: {class: {"occupancy", "entered", "exited", "dwell_s"}}}``."""
        out: dict[str, Any] = {line.name: line.counts() for line in self.lines}
        out.update({zone.name: zone.counts() for zone in self.zones})
        return out
