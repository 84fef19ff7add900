"""Draw detections, counting lines and zones on a BGR frame (for the video, display and web-preview sinks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from edgert._lazy import lazy_import

__all__ = ["Boxes", "class_color", "draw_analytics", "draw_detections"]


class Boxes(Protocol):
    """What drawing reads of a :class:`~edgert.vision.detections.Detections` (which imports this module for
    ``plot()``: naming the class here would tie the two into a circle)."""

    @property
    def xyxy(self) -> np.ndarray: ...

    @property
    def confidence(self) -> np.ndarray: ...

    @property
    def class_id(self) -> np.ndarray: ...

    @property
    def track_id(self) -> np.ndarray | None: ...

    def __len__(self) -> int: ...

    def class_name(self, class_id: int) -> str: ...


# A fixed palette (Ultralytics' colours, BGR) so a class keeps its colour across frames and runs.
_PALETTE_HEX = (
    "FF3838",
    "FF9D97",
    "FF701F",
    "FFB21D",
    "CFD231",
    "48F90A",
    "92CC17",
    "3DDB86",
    "1A9334",
    "00D4BB",
    "2C99A8",
    "00C2FF",
    "344593",
    "6473FF",
    "0018EC",
    "8438FF",
    "520085",
    "CB38FF",
    "FF95C8",
    "FF37C7",
)
_PALETTE: tuple[tuple[int, int, int], ...] = tuple(
    (int(h[4:6], 16), int(h[2:4], 16), int(h[0:2], 16)) for h in _PALETTE_HEX
)


def class_color(class_id: int) -> tuple[int, int, int]:
    return _PALETTE[int(class_id) % len(_PALETTE)]


def frame_style(frame: np.ndarray) -> tuple[int, float]:
    """(line thickness, font scale) for a frame's size: a fixed 0.5 font covered a 384x288 frame's people with
    their labels and is a speck on 4K. The font follows the shorter side (0.35 at 288 px, 0.8 at 720,
    1.2 from 1080) and lines are 1 px up to 540, then 2, 3 from 1080."""
    short = min(frame.shape[0], frame.shape[1])
    return max(1, min(3, short // 360)), float(min(1.2, max(0.35, short / 900.0)))


def draw_detections(
    frame_bgr: np.ndarray, detections: Boxes, thickness: int | None = None, font_scale: float | None = None,
    labels: bool = True,
) -> np.ndarray:
    """Draw boxes and ``name 0.87`` labels onto ``frame_bgr`` in place; returns the same array. Line and text
    sizes follow the frame's size unless given."""
    if not len(detections):
        return frame_bgr
    cv2 = lazy_import("cv2", "drawing detections")
    auto_thickness, auto_scale = frame_style(frame_bgr)
    thickness = thickness or auto_thickness
    font_scale = font_scale or auto_scale
    weight = 2 if font_scale >= 0.8 else 1
    boxes = np.rint(detections.xyxy).astype(np.int32).tolist()
    tracks = detections.track_id.tolist() if detections.track_id is not None else [None] * len(detections)
    for (x1, y1, x2, y2), conf, cid, tid in zip(boxes, detections.confidence.tolist(), detections.class_id.tolist(),
                                                tracks):
        color = class_color(cid)
        cv2.rectangle(frame_bgr, (x1, y1), (x2, y2), color, thickness, cv2.LINE_AA)
        if not labels:
            continue
        text = f"{detections.class_name(cid)} {conf:.2f}"
        if tid is not None and tid >= 0:
            text = f"#{tid} {text}"
        (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font_scale, weight)
        top = y1 - th - base - 2 if y1 - th - base - 2 >= 0 else y1  # inside the box at the frame's top
        cv2.rectangle(frame_bgr, (x1, top), (x1 + tw + 2, top + th + base + 2), color, -1)
        origin = (x1 + 1, top + th + 1)
        cv2.putText(frame_bgr, text, origin, cv2.FONT_HERSHEY_SIMPLEX, font_scale, (255, 255, 255), weight,
                    cv2.LINE_AA)
    return frame_bgr


_LINE_COLOR = (0, 255, 255)  # yellow: stands out from the class palette on most scenes
_ZONE_COLOR = (255, 160, 0)


def _label(cv2: Any, frame: np.ndarray, text: str, origin: tuple[int, int], color: tuple[int, int, int],
           font_scale: float) -> None:
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font_scale, 1)
    x = min(max(origin[0], 0), max(frame.shape[1] - tw - 2, 0))
    y = min(max(origin[1], th + base + 2), frame.shape[0] - 1)
    cv2.rectangle(frame, (x, y - th - base - 2), (x + tw + 2, y), color, -1)
    cv2.putText(frame, text, (x + 1, y - base - 1), cv2.FONT_HERSHEY_SIMPLEX, font_scale, (0, 0, 0), 1, cv2.LINE_AA)


def _total(per_class: Mapping[str, Mapping[str, Any]], key: str) -> int:
    return int(sum(int(c.get(key, 0)) for c in per_class.values()))


def draw_analytics(frame_bgr: np.ndarray, lines: Sequence[Any] = (), zones: Sequence[Any] = (),
                   counts: Mapping[str, Any] | None = None, thickness: int | None = None,
                   font_scale: float | None = None) -> np.ndarray:
    """Draw counting lines (with ``in``/``out`` totals) and zones (with occupancy) onto ``frame_bgr`` in place.

    ``lines`` and ``zones`` are :class:`~edgert.config.LineConfig` / :class:`~edgert.config.ZoneConfig` (or
    anything with ``name`` and ``points`` / ``polygon``); ``counts`` is ``Analytics.counts()``.
    """
    if not lines and not zones:
        return frame_bgr
    cv2 = lazy_import("cv2", "drawing analytics")
    auto_thickness, auto_scale = frame_style(frame_bgr)
    thickness = thickness or max(2, auto_thickness)  # lines and zones stand out from the boxes
    font_scale = font_scale or auto_scale
    counts = counts or {}
    for zone in zones:
        poly = np.rint(np.asarray(zone.polygon, np.float64)).astype(np.int32).reshape(-1, 1, 2)
        cv2.polylines(frame_bgr, [poly], True, _ZONE_COLOR, thickness, cv2.LINE_AA)
        occupancy = _total(counts.get(zone.name, {}), "occupancy")
        top = poly.reshape(-1, 2)[np.argmin(poly.reshape(-1, 2)[:, 1])]
        _label(cv2, frame_bgr, f"{zone.name}: {occupancy}", (int(top[0]), int(top[1])), _ZONE_COLOR, font_scale)
    for line in lines:
        (x1, y1), (x2, y2) = (tuple(round(float(v)) for v in p) for p in line.points)
        cv2.line(frame_bgr, (x1, y1), (x2, y2), _LINE_COLOR, thickness, cv2.LINE_AA)
        per_class = counts.get(line.name, {})
        text = f"{line.name}: in {_total(per_class, 'in')} out {_total(per_class, 'out')}"
        _label(cv2, frame_bgr, text, ((x1 + x2) // 2, (y1 + y2) // 2 - 4), _LINE_COLOR, font_scale)
    return frame_bgr
