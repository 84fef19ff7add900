"""Streaming activation statistics and the ways to turn them into INT8 ranges.

One :class:`TensorHistogram` per tensor holds a fixed number of bins of ``|x|`` over ``[0, range]``.
The first batch sets ``range`` to its largest value; when a later batch goes beyond it, ``range`` is
doubled as often as needed and neighbouring bins are summed pairwise, which is exact. So memory is the
same after 10 images or 10,000 (the way TensorRT's own calibrator grows its histograms).

Non-finite values are counted and ignored: NanoDet pads with ``-inf`` before a MaxPool, and one such
value would otherwise make the range infinite.

Range methods, all symmetric (``amax``; the INT8 scale is ``amax / 127``):

* ``minmax``: the largest finite ``|x|`` seen (tracked exactly, not from the bins).
* ``percentile``: the ``|x|`` below which ``percentile`` % of the values lie (interpolated in the bin).
* ``entropy``: the threshold whose 127-level quantization of the clipped histogram is closest in
  Kullback-Leibler divergence to the clipped histogram itself; see :func:`entropy_amax`.
* ``mse``: the threshold with the smallest expected squared error of the quantized tensor, clipping
  and rounding together; see :func:`mse_amax`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "DEFAULT_BINS",
    "KL_BINS",
    "Method",
    "TensorHistogram",
    "TensorRange",
    "entropy_amax",
    "mse_amax",
    "mse_curve",
    "percentile_amax",
]

Method = Literal["entropy", "percentile", "minmax", "mse", "mse-percentile"]

#: Bins kept per tensor while collecting. 4096 int64 counts = 32 KiB per tensor.
DEFAULT_BINS = 4096
#: Bins the entropy search works on (TensorRT's calibrator uses 2048 over [0, max]).
KL_BINS = 2048
#: INT8 levels on one side of zero.
QUANT_LEVELS = 127


@dataclass(frozen=True)
class TensorRange:
    """What calibration found for one tensor."""

    name: str
    amax: float  # the chosen symmetric range: values beyond +-amax are clipped
    min: float  # smallest finite value seen
    max: float  # largest finite value seen
    abs_max: float  # largest finite |value| seen
    count: int  # finite values seen
    nonfinite: int  # inf/nan values seen and ignored
    method: str

    @property
    def scale(self) -> float:
        """The INT8 scale TensorRT and QuantizeLinear use: ``amax / 127`` (never 0)."""
        return safe_amax(self.amax) / QUANT_LEVELS

    @property
    def clipped_fraction_hint(self) -> float:
        """``amax / abs_max``: 1.0 when nothing is clipped."""
        return self.amax / self.abs_max if self.abs_max > 0 else 1.0


def safe_amax(amax: float) -> float:
    """A usable range: an all-zero tensor gets 1.0 (any scale represents zero exactly)."""
    return amax if math.isfinite(amax) and amax > 0 else 1.0


class TensorHistogram:
    """Histogram of ``|x|`` for one tensor, updated batch by batch in constant memory."""

    def __init__(self, name: str, bins: int = DEFAULT_BINS) -> None:
        if bins < 2 or bins & (bins - 1):
            raise ValueError(f"bins must be a power of two >= 2, got {bins}")  # an edgert bug
        self.name = name
        self.bins = bins
        self.counts = np.zeros(bins, np.int64)
        self.range = 0.0  # upper edge of the last bin; 0 until a non-zero finite value arrives
        self.min = math.inf
        self.max = -math.inf
        self.count = 0
        self.nonfinite = 0
        self.zeros_before_range = 0  # exact zeros seen while range was still 0

    # -- collecting -----------------------------------------------------------------------------------
    def update(self, values: np.ndarray) -> None:
        a = np.asarray(values)
        if a.dtype != np.float32:
            a = a.astype(np.float32)
        a = a.reshape(-1)
        if a.size == 0:
            return
        finite = np.isfinite(a)
        if not finite.all():
            self.nonfinite += int(a.size - np.count_nonzero(finite))
            a = a[finite]
            if a.size == 0:
                return
        lo, hi = float(a.min()), float(a.max())
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)
        self.count += int(a.size)
        amax = max(-lo, hi)
        if amax <= 0.0:
            if self.range == 0.0:
                self.zeros_before_range += int(a.size)
            else:
                self.counts[0] += a.size
            return
        if self.range == 0.0:
            self.range = amax
            self.counts[0] += self.zeros_before_range
            self.zeros_before_range = 0
        elif amax > self.range:
            self._grow(amax)
        idx = np.abs(a)
        idx *= np.float32(self.bins / self.range)
        ii = idx.astype(np.int32)
        np.minimum(ii, self.bins - 1, out=ii)
        self.counts += np.bincount(ii, minlength=self.bins)

    def _grow(self, amax: float) -> None:
        """Double the range until ``amax`` fits, summing neighbouring bins (exact re-binning)."""
        k = max(1, math.ceil(math.log2(amax / self.range)))
        while self.range * 2.0**k < amax:  # guard against log2 rounding
            k += 1
        factor = 2**k
        if factor >= self.bins:
            total = int(self.counts.sum())
            self.counts[:] = 0
            self.counts[0] = total
        else:
            merged = self.counts.reshape(-1, factor).sum(axis=1)
            self.counts[:] = 0
            self.counts[: merged.size] = merged
        self.range *= factor

    def merge(self, other: TensorHistogram) -> None:
        """Add another histogram of the same tensor (e.g. collected in another process)."""
        if other.bins != self.bins:
            raise ValueError("histograms with different bin counts")  # an edgert bug
        if other.count == 0:
            self.nonfinite += other.nonfinite
            return
        counts = other.counts
        if other.range > 0.0 and self.range == 0.0:
            self.range = other.range
            self.counts[0] += self.zeros_before_range
            self.zeros_before_range = 0
        if other.range > self.range:
            self._grow(other.range)
        if other.range > 0.0 and other.range < self.range:
            factor = round(self.range / other.range)
            if factor & (factor - 1) or not math.isclose(other.range * factor, self.range, rel_tol=1e-6):
                # ranges not a power of two apart: re-bin by each bin's centre
                centres = (np.arange(other.bins) + 0.5) * (other.range / other.bins)
                ii = np.minimum((centres * (self.bins / self.range)).astype(np.int64), self.bins - 1)
                counts = np.bincount(ii, weights=other.counts, minlength=self.bins).astype(np.int64)
            else:
                counts = np.pad(other.counts.reshape(-1, factor).sum(axis=1), (0, self.bins - other.bins // factor))
        if other.range == 0.0:
            self.counts[0] += other.zeros_before_range
        else:
            self.counts += counts
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.count += other.count
        self.nonfinite += other.nonfinite

    # -- results ----------------------------------------------------------------------------------------
    @property
    def abs_max(self) -> float:
        if self.count == 0:
            return 0.0
        return max(-self.min, self.max, 0.0)

    def amax(self, method: Method = "entropy", percentile: float = 99.99) -> float:
        if self.count == 0 or self.range == 0.0:
            return 0.0
        if method == "minmax":
            return self.abs_max
        if method == "percentile":
            return min(percentile_amax(self.counts, self.range, percentile), self.abs_max)
        if method == "entropy":
            return min(entropy_amax(self.counts, self.range, self.abs_max), self.abs_max)
        if method == "mse":
            return min(mse_amax(self.counts, self.range), self.abs_max)
        if method == "mse-percentile":
            return min(max(mse_amax(self.counts, self.range), percentile_amax(self.counts, self.range, percentile)),
                       self.abs_max)
        raise ValueError(f"unknown method {method!r}")  # the CLI validates choices

    def result(self, method: Method = "entropy", percentile: float = 99.99) -> TensorRange:
        return TensorRange(
            name=self.name, amax=self.amax(method, percentile),
            min=self.min if self.count else 0.0, max=self.max if self.count else 0.0,
            abs_max=self.abs_max, count=self.count, nonfinite=self.nonfinite,
            method=method if method != "percentile" else f"percentile {percentile:g}",
        )


def percentile_amax(counts: np.ndarray, upper: float, percentile: float) -> float:
    """The value below which ``percentile`` % of the histogram's mass lies (linear within a bin)."""
    total = float(counts.sum())
    if total <= 0:
        return 0.0
    target = total * min(max(percentile, 0.0), 100.0) / 100.0
    cum = np.cumsum(counts, dtype=np.float64)
    i = int(np.searchsorted(cum, target, side="left"))
    i = min(i, counts.size - 1)
    before = cum[i - 1] if i > 0 else 0.0
    inside = float(counts[i])
    frac = (target - before) / inside if inside > 0 else 1.0
    width = upper / counts.size
    return (i + min(max(frac, 0.0), 1.0)) * width


def mse_curve(counts: np.ndarray, upper: float, levels: int = QUANT_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """``(thresholds, expected squared error)`` for every bin edge as the clipping threshold ``T``.

    With step ``s = T / levels``, a value below ``T`` costs the uniform rounding error ``s^2 / 12``
    (bins here are wider than ``s`` for every candidate, so values spread evenly over a step) and one
    beyond it the clipping error ``(|x| - T)^2``, taken at its bin's centre. Values in the first bin
    (exact zeros of a ReLU, mostly) quantize exactly and cost nothing. From cumulative sums, O(bins).
    """
    n = np.asarray(counts, dtype=np.float64)
    width = upper / n.size
    centres = (np.arange(n.size) + 0.5) * width
    thresholds = np.arange(1, n.size + 1) * width  # T at the upper edge of bin i-1
    inside = np.cumsum(n) - n[0]  # values in bins 1..i-1 (below T), the first bin excluded
    # tail sums over bins >= i: count, sum of centres, sum of squared centres
    c0 = np.concatenate((np.cumsum(n[::-1])[::-1][1:], [0.0]))
    c1 = np.concatenate((np.cumsum((n * centres)[::-1])[::-1][1:], [0.0]))
    c2 = np.concatenate((np.cumsum((n * centres**2)[::-1])[::-1][1:], [0.0]))
    clip = c2 - 2 * thresholds * c1 + thresholds**2 * c0
    rounding = inside * (thresholds / levels) ** 2 / 12.0
    return thresholds, np.maximum(clip, 0.0) + rounding


def mse_amax(counts: np.ndarray, upper: float, levels: int = QUANT_LEVELS) -> float:
    """The clipping threshold of least expected squared error (:func:`mse_curve`); ``upper`` when the
    histogram is empty."""
    if float(np.sum(counts)) <= 0:
        return 0.0
    thresholds, err = mse_curve(counts, upper, levels)
    return float(thresholds[int(np.argmin(err))])


def _resample(counts: np.ndarray, upper: float, new_upper: float, bins: int) -> np.ndarray:
    """Re-bin ``counts`` over [0, upper] into ``bins`` bins over [0, new_upper] (uniform within a bin)."""
    edges = np.linspace(0.0, upper, counts.size + 1)
    cum = np.concatenate(([0.0], np.cumsum(counts, dtype=np.float64)))
    new_edges = np.linspace(0.0, new_upper, bins + 1)
    return np.diff(np.interp(new_edges, edges, cum))


def entropy_amax(counts: np.ndarray, upper: float, abs_max: float | None = None,
                 bins: int = KL_BINS, levels: int = QUANT_LEVELS, start: int = 128) -> float:
    """The KL-divergence threshold of TensorRT's entropy calibration, on a histogram of ``|x|``.

    Follows the algorithm NVIDIA published for TensorRT's calibrator (Migacz, "8-bit Inference with
    TensorRT", GTC 2017; NVIDIA's MLPerf calibration notes), which EntropyCalibration2 implements:

    1. the histogram is brought to ``bins`` (2048) equal bins over [0, max |x|], and its first bin (the
       flood of near-zero values) is discarded;
    2. for every candidate end bin ``i`` from ``start`` (128) to ``bins``: the reference ``P`` is the
       first ``i`` bins with everything beyond folded into bin ``i-1``; ``Q`` is ``P``'s first ``i``
       bins merged into ``levels`` (127) equal groups, each group's mass spread evenly over the group's
       non-empty bins (empty bins stay empty, as quantized values cannot land there);
    3. the ``i`` with the smallest KL(P || Q) wins, and the range is the centre of bin ``i-1``.

    TensorRT's source is closed; the details above are its published description. Where it is silent
    (ties: the first minimum wins; a ``Q`` of zero where ``P`` is not, which can only happen in the
    folded last bin, costs a large finite penalty) the choices are ours. All candidates are evaluated
    at once from cumulative sums (:func:`_kl_curve`), O(bins x levels) instead of O(bins^2).
    """
    counts = np.asarray(counts, dtype=np.float64)
    nz = np.nonzero(counts)[0]
    if nz.size == 0:
        return 0.0
    width = upper / counts.size
    top = float(abs_max) if abs_max is not None and abs_max > 0 else (nz[-1] + 1) * width
    top = min(top, upper)
    hist = _resample(counts, upper, top, bins)
    hist[0] = 0.0  # discard the first bin
    total = hist.sum()
    if total <= 0:
        return top
    best_i = start + int(np.argmin(_kl_curve(hist, start, levels)))
    return (best_i - 0.5) * (top / bins)


def _kl_curve(hist: np.ndarray, start: int = 128, levels: int = QUANT_LEVELS) -> np.ndarray:
    """KL(P_i || Q_i) for every candidate end bin ``i`` in ``start..len(hist)``, vectorized.

    For candidate ``i`` bin ``k < i`` belongs to group ``floor(k * levels / i)``, so group ``j`` spans
    bins ``[ceil(j*i/levels), ceil((j+1)*i/levels))``; group masses and non-empty-bin counts then come
    from cumulative sums. With ``p`` = P normalized and ``q`` = Q normalized,
    KL = sum_k p_k log p_k - sum_j (sum of p over group j) log q_j, q_j being the per-bin value of group j.
    """
    n = hist.size
    total = float(hist.sum())
    cand = np.arange(start, n + 1, dtype=np.int64)  # candidates i
    csum = np.concatenate(([0.0], np.cumsum(hist)))  # csum[k] = sum(hist[:k])
    present = hist > 0
    cnt = np.concatenate(([0], np.cumsum(present)))
    with np.errstate(divide="ignore", invalid="ignore"):
        hlogh = np.where(present, hist * np.log(np.where(present, hist, 1.0)), 0.0)
    chl = np.concatenate(([0.0], np.cumsum(hlogh)))
    tail = total - csum[cand]  # mass beyond bin i-1, folded into it
    last = hist[cand - 1] + tail  # P's last bin
    # sum_k p_k log p_k: bins before i-1 from the cumulative sums, the folded last bin on its own
    a = (chl[cand - 1] - csum[cand - 1] * np.log(total)) / total
    with np.errstate(divide="ignore", invalid="ignore"):
        a += np.where(last > 0, (last / total) * np.log(np.where(last > 0, last, 1.0) / total), 0.0)
    j = np.arange(levels + 1, dtype=np.int64)
    bounds = (j[None, :] * cand[:, None] + levels - 1) // levels  # (n_cand, levels+1) group starts
    mass = csum[bounds[:, 1:]] - csum[bounds[:, :-1]]
    filled = (cnt[bounds[:, 1:]] - cnt[bounds[:, :-1]]).astype(np.float64)
    # the last bin counts as non-empty when outliers were folded into an empty bin
    extra = (hist[cand - 1] == 0) & (tail > 0)
    filled[:, -1] += extra
    q_total = csum[cand]  # Q keeps the mass of hist[:i]
    group_p = mass.copy()
    group_p[:, -1] += tail
    group_p /= total
    with np.errstate(divide="ignore", invalid="ignore"):
        qv = np.where(filled > 0, mass / np.where(filled > 0, filled, 1.0), 0.0) / q_total[:, None]
        qv = np.maximum(qv, 1e-12)
        b = np.sum(np.where(group_p > 0, group_p * np.log(qv), 0.0), axis=1)
    kl = a - b
    kl[~np.isfinite(kl) | (q_total <= 0)] = np.inf
    result: np.ndarray = kl
    return result
