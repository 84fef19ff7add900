"""Counting lines: in/out per class when a track's anchor point crosses a line segment.

As DeepStream's nvdsanalytics and supervision's ``LineZone`` do, a box is judged at one point (its bottom
centre by default); a crossing is a step of that point, between two frames where the track was seen, from
one side of the line to the other *through* the segment. Walking from the line's first point to its
second, a move from the right-hand side to the left-hand side is ``in``, the opposite ``out``. A line's
``direction`` (``in``, ``out``; ``both`` by default) says which of the two it counts; the other is ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.analytics.geometry import path_crosses_segment, side_of_line
from edgert.config import LineConfig
from edgert.vision.detections import Detections
from edgert.vision.draw import draw_label

__all__ = ["LINE_COLOR", "LineCounter", "class_matches", "counted_tracks", "draw", "owns", "text"]

LINE_COLOR = (0, 255, 255)  # yellow: stands out from the class palette on most scenes


def class_matches(classes: tuple[str, ...] | None, class_id: int, class_name: str) -> bool:
    return classes is None or class_name in classes or str(class_id) in classes


def counted_tracks(detections: Detections, classes: tuple[str, ...] | None) -> Iterator[tuple[int, int, int, str]]:
    """``(row, track id, class id, class name)`` of the tracked rows whose class a line or zone counts (untracked rows,
    track id -1, are never counted). Both counters walk a frame's detections through this."""
    if detections.track_id is None:
        return
    for i, (tid, cid) in enumerate(zip(detections.track_id.tolist(), detections.class_id.tolist())):
        if tid < 0:
            continue
        name = detections.class_name(cid)
        if class_matches(classes, cid, name):
            yield i, tid, cid, name


class LineCounter:
    """One counting line. ``update`` takes tracked detections with their anchor points; returns events."""

    def __init__(self, config: LineConfig, lost_after: int = 30) -> None:
        self.config = config
        self.name = config.name
        self.a = np.asarray(config.points[0], np.float64)
        self.b = np.asarray(config.points[1], np.float64)
        self.lost_after = lost_after
        # track id -> (last non-zero side, last point, frame last seen)
        self._tracks: dict[int, tuple[int, np.ndarray, int]] = {}
        self._counts: dict[str, dict[str, int]] = {}
        # the directions this line counts: its counts hold only those (a zero means none crossed, not "not counted")
        self._directions = ("in", "out") if config.direction == "both" else (config.direction,)

    def update(self, detections: Detections, anchors: np.ndarray, frame_index: int,
               timestamp: float) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if detections.track_id is None:
            return events
        sides = side_of_line(anchors, self.a, self.b)
        for i, tid, cid, name in counted_tracks(detections, self.config.classes):
            side = int(sides[i])
            point = anchors[i]
            previous = self._tracks.get(tid)
            if previous is not None:
                last_side, last_point, _ = previous
                if side != 0 and last_side != 0 and side != last_side and path_crosses_segment(
                        last_point, point, self.a, self.b):
                    direction = "in" if last_side > 0 else "out"
                    if self.config.direction != "both" and direction != self.config.direction:
                        self._tracks[tid] = (side, point.copy(), frame_index)
                        continue  # a crossing this line does not count (direction filter)
                    per_class = self._counts.setdefault(name, dict.fromkeys(self._directions, 0))
                    per_class[direction] += 1
                    events.append({"type": "line_cross", "line": self.name, "track_id": tid, "class": name,
                                   "class_id": cid, "direction": direction, "time": round(timestamp, 6),
                                   "frame": frame_index})
                if side == 0:
                    side = last_side  # on the line: the side it came from still counts
            self._tracks[tid] = (side, point.copy(), frame_index)
        self._forget(frame_index)
        return events

    def _forget(self, frame_index: int) -> None:
        stale = [tid for tid, (_, _, seen) in self._tracks.items() if frame_index - seen > self.lost_after]
        for tid in stale:
            del self._tracks[tid]

    def counts(self) -> dict[str, dict[str, int]]:
        """``{class: {"in": n, "out": n}}`` since the start (only the counted direction for a one-way line)."""
        return {name: dict(c) for name, c in sorted(self._counts.items())}


def owns(figures: Mapping[str, Any]) -> bool:
    """Whether one class's figures are a line's: crossings ``in`` and/or ``out``."""
    return "in" in figures or "out" in figures


def text(counts: Mapping[str, Mapping[str, Any]]) -> str:
    """One line's counts as the run summary words them: ``person 3 in, 1 out``."""
    return "; ".join(f"{c} {v.get('in', 0)} in, {v.get('out', 0)} out" for c, v in counts.items())


def _total(per_class: Mapping[str, Mapping[str, Any]], key: str) -> int:
    return int(sum(int(c.get(key, 0)) for c in per_class.values()))


def draw(frame_bgr: np.ndarray, config: LineConfig, counts: Mapping[str, Mapping[str, Any]]) -> None:
    """The line (in pixels) with its ``in``/``out`` totals, drawn in place."""
    cv2 = lazy_import("cv2", "drawing analytics")
    (x1, y1), (x2, y2) = (tuple(round(float(v)) for v in p) for p in config.points)
    cv2.line(frame_bgr, (x1, y1), (x2, y2), LINE_COLOR, 2, cv2.LINE_AA)
    label = f"{config.name}: in {_total(counts, 'in')} out {_total(counts, 'out')}"
    draw_label(frame_bgr, label, ((x1 + x2) // 2, (y1 + y2) // 2 - 4), LINE_COLOR)
