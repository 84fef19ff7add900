"""Zones: which tracks are inside a polygon, when they enter and leave, and how long they stay.

A track is inside while its anchor point (bottom centre by default) is inside the polygon. It stays
counted while it is briefly unseen (a missed detection, an occlusion) and leaves, with ``reason: lost``,
once it has not been seen for ``lost_after`` frames; the time in zone then ends when it was last seen.
Times are the frames' media time (:func:`edgert.io.sources.media_time`), so a file's dwell is video time.

A zone with ``crowded_at: N`` is crowded while N or more tracks are inside: ``zone_crowded`` when the
occupancy reaches N, ``zone_clear`` when it falls below N again (after the frame's exits), once each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.analytics.geometry import points_in_polygon
from edgert.analytics.lines import counted_tracks
from edgert.config import ZoneConfig
from edgert.vision.detections import Detections
from edgert.vision.draw import draw_label

__all__ = ["ZONE_COLOR", "ZoneMonitor", "draw", "owns", "text"]

ZONE_COLOR = (255, 160, 0)


@dataclass
class _Visit:
    class_name: str
    class_id: int
    entered_time: float
    entered_frame: int
    seen_time: float
    seen_frame: int


class ZoneMonitor:
    """One zone. ``update`` takes tracked detections with their anchor points; returns events."""

    def __init__(self, config: ZoneConfig, lost_after: int = 30) -> None:
        self.config = config
        self.name = config.name
        self.polygon = np.asarray(config.polygon, np.float64)
        self.lost_after = lost_after
        self._inside: dict[int, _Visit] = {}
        self._totals: dict[str, dict[str, float]] = {}
        self.crowded = False
        self.crowded_times = 0  # how many times it became crowded

    def _total(self, name: str) -> dict[str, float]:
        return self._totals.setdefault(name, {"entered": 0, "exited": 0, "dwell_s": 0.0})

    def update(self, detections: Detections, anchors: np.ndarray, frame_index: int,
               timestamp: float) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if detections.track_id is None:
            return events
        inside = points_in_polygon(anchors, self.polygon)
        for i, tid, cid, name in counted_tracks(detections, self.config.classes):
            visit = self._inside.get(tid)
            if inside[i]:
                if visit is None:
                    self._inside[tid] = _Visit(name, cid, timestamp, frame_index, timestamp, frame_index)
                    self._total(name)["entered"] += 1
                    events.append(self._event("zone_enter", tid, name, cid, timestamp, frame_index))
                else:
                    visit.seen_time, visit.seen_frame = timestamp, frame_index
            elif visit is not None:
                events.append(self._leave(tid, visit, timestamp, frame_index, "left"))
        for tid, visit in list(self._inside.items()):
            if frame_index - visit.seen_frame > self.lost_after:
                events.append(self._leave(tid, visit, visit.seen_time, visit.seen_frame, "lost"))
        threshold = self.config.crowded_at
        if threshold is not None and self.crowded != (len(self._inside) >= threshold):
            self.crowded = not self.crowded
            self.crowded_times += self.crowded
            events.append({"type": "zone_crowded" if self.crowded else "zone_clear", "zone": self.name,
                           "occupancy": len(self._inside), "crowded_at": threshold, "time": round(timestamp, 6),
                           "frame": frame_index})
        return events

    def _event(self, kind: str, tid: int, name: str, cid: int, timestamp: float, frame: int) -> dict[str, Any]:
        return {"type": kind, "zone": self.name, "track_id": tid, "class": name, "class_id": cid,
                "time": round(timestamp, 6), "frame": frame}

    def _leave(self, tid: int, visit: _Visit, timestamp: float, frame: int, reason: str) -> dict[str, Any]:
        del self._inside[tid]
        dwell = max(0.0, timestamp - visit.entered_time)
        total = self._total(visit.class_name)
        total["exited"] += 1
        total["dwell_s"] += dwell
        event = self._event("zone_exit", tid, visit.class_name, visit.class_id, timestamp, frame)
        event["dwell_s"] = round(dwell, 3)
        event["reason"] = reason
        return event

    def dwell(self, timestamp: float) -> dict[int, float]:
        """Seconds each track now inside has spent in the zone, up to ``timestamp``."""
        return {tid: max(0.0, timestamp - v.entered_time) for tid, v in self._inside.items()}

    def occupancy(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for visit in self._inside.values():
            out[visit.class_name] = out.get(visit.class_name, 0) + 1
        return out

    def counts(self) -> dict[str, dict[str, float]]:
        """``{class: {"occupancy", "entered", "exited", "dwell_s"}}``; dwell_s sums finished visits."""
        occupancy = self.occupancy()
        out: dict[str, dict[str, float]] = {}
        for name in sorted(set(self._totals) | set(occupancy)):
            total = self._total(name)
            out[name] = {"occupancy": occupancy.get(name, 0), "entered": int(total["entered"]),
                         "exited": int(total["exited"]), "dwell_s": round(total["dwell_s"], 3)}
        return out


def owns(figures: Mapping[str, Any]) -> bool:
    """Whether one class's figures are a zone's: ``occupancy``, ``entered``, ``exited``."""
    return "occupancy" in figures


def text(counts: Mapping[str, Mapping[str, Any]]) -> str:
    """One zone's counts as the run summary words them: ``person 2 now, 5 entered, 3 exited``."""
    return "; ".join(f"{c} {int(v['occupancy'])} now, {v['entered']} entered, {v['exited']} exited"
                     for c, v in counts.items())


def draw(frame_bgr: np.ndarray, config: ZoneConfig, counts: Mapping[str, Mapping[str, Any]]) -> None:
    """The zone's polygon (in pixels) with its occupancy, drawn in place."""
    cv2 = lazy_import("cv2", "drawing analytics")
    poly = np.rint(np.asarray(config.polygon, np.float64)).astype(np.int32).reshape(-1, 1, 2)
    cv2.polylines(frame_bgr, [poly], True, ZONE_COLOR, 2, cv2.LINE_AA)
    occupancy = int(sum(int(c.get("occupancy", 0)) for c in counts.values()))
    top = poly.reshape(-1, 2)[np.argmin(poly.reshape(-1, 2)[:, 1])]
    draw_label(frame_bgr, f"{config.name}: {occupancy}", (int(top[0]), int(top[1])), ZONE_COLOR)
