"""The little plane geometry that counting lines and zones need, vectorised with numpy.

supervision has the same (``LineZone``, ``PolygonZone``), but it brings matplotlib, PyAV and requests with
it; these few functions are all the analytics use. Coordinates are frame pixels, y pointing down.
"""

from __future__ import annotations

import numpy as np

__all__ = ["anchor_points", "path_crosses_segment", "points_in_polygon", "side_of_line"]


def anchor_points(xyxy: np.ndarray, anchor: str = "bottom_center") -> np.ndarray:
    """(N, 2) float64 points of ``xyxy`` boxes: their bottom centre (where a person stands) or centre."""
    boxes = np.asarray(xyxy, np.float64).reshape(-1, 4)
    x = (boxes[:, 0] + boxes[:, 2]) * 0.5
    y = boxes[:, 3] if anchor == "bottom_center" else (boxes[:, 1] + boxes[:, 3]) * 0.5
    out: np.ndarray = np.stack([x, y], axis=1)
    return out


def side_of_line(points: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sign (-1, 0, 1) of each point against the line a->b: -1 is the left-hand side walking from a to b
    on the screen (y down), +1 the right-hand side, 0 on the line."""
    p = np.asarray(points, np.float64).reshape(-1, 2)
    d = b - a
    cross = d[0] * (p[:, 1] - a[1]) - d[1] * (p[:, 0] - a[0])
    sides: np.ndarray = np.sign(cross).astype(np.int8)
    return sides


def path_crosses_segment(p: np.ndarray, q: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the step p->q passes between a and b, given that p and q lie on opposite sides of line ab.

    A step that changes side beyond the end of the segment (walking round the line) does not cross it.
    """
    d = q - p
    oa = d[0] * (a[1] - p[1]) - d[1] * (a[0] - p[0])
    ob = d[0] * (b[1] - p[1]) - d[1] * (b[0] - p[0])
    return bool(oa * ob <= 0.0)


def points_in_polygon(points: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """(N,) bool: whether each point is inside ``polygon`` ((M, 2), any winding), by the even-odd rule."""
    p = np.asarray(points, np.float64).reshape(-1, 2)
    poly = np.asarray(polygon, np.float64).reshape(-1, 2)
    if not len(p):
        return np.zeros(0, bool)
    x, y = p[:, 0:1], p[:, 1:2]  # (N, 1) against (M,) edges
    x1, y1 = poly[:, 0], poly[:, 1]
    x2, y2 = np.roll(x1, -1), np.roll(y1, -1)
    straddles = (y1 > y) != (y2 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = x1 + (y - y1) * (x2 - x1) / (y2 - y1)
    hits = straddles & (x < x_cross)
    inside: np.ndarray = (np.count_nonzero(hits, axis=1) % 2) == 1
    return inside
