"""A plain, loop-by-loop implementation of the entropy calibration search, to check the vectorized one."""

from __future__ import annotations

import math

import numpy as np


def kl_curve_reference(hist: np.ndarray, start: int = 128, levels: int = 127) -> list[float]:
    hist = np.asarray(hist, np.float64)
    out = []
    for i in range(start, hist.size + 1):
        ref = [float(v) for v in hist[:i]]
        ref[i - 1] += float(hist[i:].sum())
        present = [v > 0 for v in ref]
        groups: dict[int, list[int]] = {}
        for k in range(i):
            groups.setdefault((k * levels) // i, []).append(k)
        q = [0.0] * i
        for members in groups.values():
            mass = sum(float(hist[k]) for k in members)
            filled = [k for k in members if present[k]]
            for k in filled:
                q[k] = mass / len(filled)
        p_sum, q_sum = sum(ref), sum(q)
        if q_sum <= 0:
            out.append(math.inf)
            continue
        kl = 0.0
        for k in range(i):
            if ref[k] > 0:
                pk = ref[k] / p_sum
                qk = max(q[k] / q_sum, 1e-12)
                kl += pk * math.log(pk / qk)
        out.append(kl)
    return out
