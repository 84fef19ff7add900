"""Streaming histograms and the three range methods, against direct computations."""

from __future__ import annotations

import numpy as np
import pytest

from edgert.calib.histograms import TensorHistogram, _kl_curve, entropy_amax, percentile_amax

from .kl_reference import kl_curve_reference


def test_growing_range_rebins_exactly_like_a_direct_histogram() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(0, s, 5000).astype(np.float32) for s in (0.5, 1.0, 3.0, 10.0)]
    h = TensorHistogram("t", bins=256)
    for b in batches:
        h.update(b)
    data = np.abs(np.concatenate(batches))
    direct, _ = np.histogram(data, bins=256, range=(0, h.range))
    # identical up to values sitting exactly on a bin edge (float rounding of the index)
    assert np.abs(h.counts - direct).sum() <= 4
    assert h.counts.sum() == data.size
    # the range grew by powers of two from the first batch's maximum
    ratio = h.range / float(np.abs(batches[0]).max())
    assert ratio == pytest.approx(2 ** round(np.log2(ratio)))


def test_memory_is_fixed_whatever_the_number_of_batches() -> None:
    rng = np.random.default_rng(1)
    h = TensorHistogram("t", bins=512)
    before = h.counts.nbytes
    for i in range(200):
        h.update(rng.normal(0, 1 + i, 1000))
    assert h.counts.nbytes == before and h.counts.shape == (512,)
    assert h.count == 200_000


def test_non_finite_values_are_counted_and_ignored() -> None:
    h = TensorHistogram("padded")
    x = np.array([-np.inf, 0.5, -0.25, np.nan, np.inf, 1.0], np.float32)
    h.update(x)
    assert h.nonfinite == 3 and h.count == 3
    assert h.abs_max == 1.0 and h.amax("minmax") == 1.0
    assert np.isfinite(h.amax("entropy")) and np.isfinite(h.amax("percentile"))
    only_inf = TensorHistogram("inf")
    only_inf.update(np.full(10, -np.inf, np.float32))
    assert only_inf.amax("minmax") == 0.0 and only_inf.result("entropy").scale > 0  # all-zero range: usable scale


def test_zeros_before_any_signal_land_in_the_first_bin() -> None:
    h = TensorHistogram("relu")
    h.update(np.zeros(100, np.float32))
    h.update(np.linspace(0, 2, 100, dtype=np.float32))
    assert h.counts.sum() == 200 and h.counts[0] >= 100


def test_minmax_and_percentile() -> None:
    rng = np.random.default_rng(2)
    data = rng.uniform(-4, 4, 200_000).astype(np.float32)
    h = TensorHistogram("u")
    h.update(data)
    assert h.amax("minmax") == pytest.approx(float(np.abs(data).max()))
    assert h.amax("percentile", 50.0) == pytest.approx(2.0, abs=0.01)
    assert h.amax("percentile", 99.0) == pytest.approx(float(np.percentile(np.abs(data), 99.0)), abs=0.01)
    assert percentile_amax(np.array([0, 10, 0, 0]), 4.0, 100.0) == pytest.approx(2.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorized_kl_curve_matches_the_loop_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = np.abs(rng.laplace(0, 1, 30_000))
    counts, _ = np.histogram(data, bins=320, range=(0, data.max()))
    counts = counts.astype(np.float64)
    counts[0] = 0
    if seed == 1:
        counts[180:300] = 0  # a gap: the folded last bin can be empty in Q
    fast = _kl_curve(counts, 128)
    slow = np.array(kl_curve_reference(counts, 128))
    finite = np.isfinite(slow)
    assert np.array_equal(np.isfinite(fast), finite)
    assert np.allclose(fast[finite], slow[finite], rtol=1e-9, atol=1e-12)


def test_entropy_clips_long_tails_and_keeps_compact_distributions() -> None:
    rng = np.random.default_rng(3)
    gauss = TensorHistogram("g")
    gauss.update(rng.normal(0, 1, 500_000).astype(np.float32))
    amax = gauss.amax("entropy")
    assert 2.0 < amax < gauss.abs_max  # clips the far tail, keeps the body
    uniform = TensorHistogram("u")
    uniform.update(rng.uniform(-1, 1, 500_000).astype(np.float32))
    assert uniform.amax("entropy") == pytest.approx(1.0, abs=0.02)  # nothing worth clipping
    assert entropy_amax(np.zeros(16), 1.0) == 0.0


def test_merge_equals_one_histogram_of_everything() -> None:
    rng = np.random.default_rng(4)
    a_data, b_data = rng.normal(0, 1, 4000), rng.normal(0, 5, 4000)
    a, b, both = TensorHistogram("t", 256), TensorHistogram("t", 256), TensorHistogram("t", 256)
    a.update(a_data)
    b.update(b_data)
    both.update(a_data)
    both.update(b_data)
    a.merge(b)
    assert a.count == both.count and a.abs_max == both.abs_max
    assert a.amax("percentile", 99.0) == pytest.approx(both.amax("percentile", 99.0), rel=0.05)


def test_mse_range_matches_a_brute_force_search_and_clips_a_long_tail() -> None:
    from edgert.calib.histograms import mse_amax

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.laplace(0.0, 1.0, 200_000), [40.0, -38.0]])  # two far outliers
    h = TensorHistogram("t")
    h.update(x.astype(np.float32))
    amax = h.amax("mse")
    assert 4.0 < amax < 0.8 * h.abs_max  # the outliers are clipped, the bulk is not

    def quant_mse(t: float) -> float:
        s = t / 127
        return float(np.mean((np.clip(np.rint(x / s), -127, 127) * s - x) ** 2))

    grid = np.linspace(2.0, 40.0, 300)
    best = grid[int(np.argmin([quant_mse(t) for t in grid]))]
    assert quant_mse(amax) <= 1.05 * quant_mse(best)
    assert mse_amax(np.zeros(16, np.int64), 1.0) == 0.0
