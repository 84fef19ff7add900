"""Draw detections on a BGR frame (for the video, display and web-preview sinks), and the labels analytics
rules draw beside their own lines and polygons (:func:`draw_label`)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgert._lazy import lazy_import

__all__ = ["Boxes", "class_color", "draw_detections", "draw_label"]


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


def draw_label(frame: np.ndarray, text: str, origin: tuple[int, int], color: tuple[int, int, int],
               font_scale: float = 0.5) -> None:
    """``text`` on a filled box of ``color`` at ``origin``, kept inside the frame (a line's or zone's label)."""
    cv2 = lazy_import("cv2", "drawing analytics")
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font_scale, 1)
    x = min(max(origin[0], 0), max(frame.shape[1] - tw - 2, 0))
    y = min(max(origin[1], th + base + 2), frame.shape[0] - 1)
    cv2.rectangle(frame, (x, y - th - base - 2), (x + tw + 2, y), color, -1)
    cv2.putText(frame, text, (x + 1, y - base - 1), cv2.FONT_HERSHEY_SIMPLEX, font_scale, (0, 0, 0), 1, cv2.LINE_AA)
