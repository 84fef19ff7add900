"""Optimal one-to-one assignment (the linear sum assignment problem) for the tracker's IoU matching.

SciPy's ``linear_sum_assignment`` is used when SciPy is installed; otherwise :func:`assign_max` runs a
pure-Python port of the same algorithm (the shortest augmenting path of Crouse, "On implementing 2D
rectangular assignment algorithms", IEEE TAES 2016, as in SciPy's ``rectangular_lsap.cpp``), step for
step, so the two give the same pairs even when several assignments tie. Why a port and not a greedy
match: greedy IoU matching differs from the Hungarian answer whenever two people overlap, which is
exactly when a tracker's ids are at stake. The matrices here are small (tracks x detections of one
frame), so the O(n^3) Python loop costs well under a millisecond per frame at the sizes the pipeline sees.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["assign_max", "assign_max_python", "load_solver"]


def _scipy_lsap() -> Any:
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError:  # SciPy is optional: the port below gives the same answer
        return None
    return linear_sum_assignment


def load_solver() -> None:
    """Import SciPy's solver now, where there is one. Why: its import takes 0.3-1 s, and made on the tracker's
    first match it held that frame and every frame behind it (one stream with ByteTrack: p99 346 ms against
    83 ms without tracking on the CPU machine, 1.08 s on the H200); a tracker made at start-up pays it there."""
    _scipy_lsap()


def assign_max(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns of the assignment that maximises the summed ``similarity`` (rows increasing)."""
    lsap = _scipy_lsap()
    if lsap is not None:
        rows, cols = lsap(similarity, maximize=True)
        return np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    return assign_max_python(similarity)


def _augmenting_path(cost: np.ndarray, u: list[float], v: list[float], path: list[int], row4col: list[int],
                     spc: list[float], i: int, sr: list[bool], sc: list[bool]) -> tuple[int, float]:
    nc = cost.shape[1]
    min_val = 0.0
    remaining = [nc - it - 1 for it in range(nc)]  # SciPy walks the columns in reverse order
    num_remaining = nc
    for j in range(nc):
        sc[j] = False
        spc[j] = math.inf
    for r in range(len(sr)):
        sr[r] = False
    sink = -1
    while sink == -1:
        index = -1
        lowest = math.inf
        sr[i] = True
        row = cost[i]
        for it in range(num_remaining):
            j = remaining[it]
            r = min_val + float(row[j]) - u[i] - v[j]
            if r < spc[j]:
                path[j] = i
                spc[j] = r
            # On a tie prefer a free column: it ends the path (SciPy's rule, same reason).
            if spc[j] < lowest or (spc[j] == lowest and row4col[j] == -1):
                lowest = spc[j]
                index = it
        min_val = lowest
        if min_val == math.inf:
            return -1, min_val
        j = remaining[index]
        if row4col[j] == -1:
            sink = j
        else:
            i = row4col[j]
        sc[j] = True
        num_remaining -= 1
        remaining[index] = remaining[num_remaining]
    return sink, min_val


def assign_max_python(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`assign_max` without SciPy (same algorithm, same tie-breaking)."""
    cost = np.asarray(similarity, np.float64)
    if cost.ndim != 2:
        raise ValueError(f"expected a 2-D similarity matrix, got shape {cost.shape}")
    if cost.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    transpose = cost.shape[1] < cost.shape[0]
    if transpose:
        cost = cost.T
    cost = -cost  # maximise
    nr, nc = cost.shape
    u = [0.0] * nr
    v = [0.0] * nc
    spc = [math.inf] * nc
    path = [-1] * nc
    col4row = [-1] * nr
    row4col = [-1] * nc
    sr = [False] * nr
    sc = [False] * nc
    for cur in range(nr):
        sink, min_val = _augmenting_path(cost, u, v, path, row4col, spc, cur, sr, sc)
        if sink < 0:
            raise ValueError("the similarity matrix has no finite assignment")
        u[cur] += min_val
        for i in range(nr):
            if sr[i] and i != cur:
                u[i] += min_val - spc[col4row[i]]
        for j in range(nc):
            if sc[j]:
                v[j] -= min_val - spc[j]
        j = sink
        while True:
            i = path[j]
            row4col[j] = i
            col4row[i], j = j, col4row[i]
            if i == cur:
                break
    c4r = np.asarray(col4row, np.int64)
    if transpose:
        order = np.argsort(c4r, kind="stable")
        return c4r[order], order.astype(np.int64)
    return np.arange(nr, dtype=np.int64), c4r
