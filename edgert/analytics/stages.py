"""Result stages: what runs on each frame's detections after decoding and before the sinks.

The pipeline's result thread (one, in frame order) runs ``make_result_stages(config)`` once and then,
for every frame, :func:`run_stages`: tracking first (it sets ``track_id``), then the lines and zones that
need it. Each stage is one method, ``process(detections, frame_index, timestamp) -> (detections,
events)``; ``timestamp`` is the frame's media time (the source's own clock, see
:func:`edgert.io.sources.media_time`). Events are plain dicts with a ``type`` (``line_cross``,
``zone_enter``, ``zone_exit``, ``zone_crowded``, ``zone_clear``) that the sinks write as their own records
(``FrameResult.events``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from edgert.analytics.analytics import Analytics
from edgert.analytics.table import resolve_rules
from edgert.analytics.tracking import Tracker
from edgert.config import PipelineConfig
from edgert.vision.detections import Detections

__all__ = ["AnalyticsStage", "ResultStage", "TrackingStage", "make_result_stages", "run_stages", "stages_summary"]


class ResultStage(Protocol):
    name: str

    def process(self, detections: Detections, frame_index: int,
                timestamp: float) -> tuple[Detections, list[dict[str, Any]]]: ...

    def summary(self) -> dict[str, Any]: ...


class TrackingStage:
    name = "track"

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker

    def process(self, detections: Detections, frame_index: int,
                timestamp: float) -> tuple[Detections, list[dict[str, Any]]]:
        return self.tracker.update(detections, frame_index, timestamp), []

    def summary(self) -> dict[str, Any]:
        return {"tracking": self.tracker.summary()}


class AnalyticsStage:
    name = "analytics"

    def __init__(self, analytics: Analytics) -> None:
        self.analytics = analytics

    def process(self, detections: Detections, frame_index: int,
                timestamp: float) -> tuple[Detections, list[dict[str, Any]]]:
        return detections, self.analytics.update(detections, frame_index, timestamp)

    def summary(self) -> dict[str, Any]:
        return {"counts": self.analytics.counts()}


def make_result_stages(config: PipelineConfig, fps: float | None = None,
                       frame_size: tuple[int, int] | None = None, names: Sequence[str] = (),
                       source: str = "?") -> list[ResultStage]:
    """The stages ``config`` asks for, in the order they must run; [] when it asks for none.

    ``fps`` is the source's frame rate (the tracker's time base when ``track.frame_rate`` is not set).
    With ``frame_size`` (width, height) and the model's class ``names``, the lines and zones are checked
    against that source first (:func:`~edgert.analytics.table.resolve_rules`: 0..1 coordinates scaled,
    points off the frame and unknown classes refused in one line).
    """
    stages: list[ResultStage] = []
    analytics = config.analytics
    if analytics.enabled and frame_size is not None:
        analytics = resolve_rules(analytics, int(frame_size[0]), int(frame_size[1]), names, source)
    if config.track is not None:
        stages.append(TrackingStage(Tracker.from_config(config.track, fps)))
    if analytics.enabled:
        stages.append(AnalyticsStage(Analytics(analytics)))
    return stages


def run_stages(stages: Sequence[ResultStage], detections: Detections, frame_index: int,
               timestamp: float) -> tuple[Detections, list[dict[str, Any]]]:
    """One frame through every stage: the detections the sinks get, and the frame's events."""
    events: list[dict[str, Any]] = []
    for stage in stages:
        detections, more = stage.process(detections, frame_index, timestamp)
        events.extend(more)
    return detections, events


def stages_summary(stages: Sequence[ResultStage]) -> dict[str, Any]:
    """What the stages add to the run summary: ``tracking`` and ``counts``."""
    out: dict[str, Any] = {}
    for stage in stages:
        out.update(stage.summary())
    return out
