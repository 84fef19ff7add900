"""A batch's statistics in one call (``record_latencies`` then ``count_frame`` per frame) equal ``record_frame`` per
frame: the same latency windows and sums, histograms per source, event counts and counters, also past the ring's
size."""

from __future__ import annotations

import numpy as np

from edgert.stats import STAGES, WINDOW, PipelineStats


def test_batch_statistics_equal_one_call_per_frame() -> None:
    rng = np.random.default_rng(7)
    one, batched = PipelineStats(), PipelineStats()
    sources = ["a", "b", "c"]
    for size in (16, 3, 1, WINDOW + 5, 40):  # a batch longer than the window too
        timings = rng.exponential(0.02, (size, len(STAGES)))
        names = [sources[int(k)] for k in rng.integers(0, 3, size)]
        events = [[{"type": "line_crossed"}] if k % 5 == 0 else [] for k in range(size)]
        for t, name, ev in zip(timings, names, events):
            one.record_frame(t, 2, name, ev)
        batched.record_latencies(timings, names)
        for name, ev in zip(names, events):
            batched.count_frame(2, name, ev)
    assert batched.frames == one.frames and batched.detections == one.detections
    assert batched.events == one.events
    for stage in STAGES:
        a, b = one.latency[stage], batched.latency[stage]
        assert a.count == b.count and np.isclose(a._sum, b._sum)
        assert np.array_equal(np.sort(a.window()), np.sort(b.window()))
        assert a.quantiles_ms() == b.quantiles_ms()
    assert set(one.histograms) == set(batched.histograms) == set(sources)
    for name in sources:
        (ca, sa), (cb, sb) = one.histograms[name].snapshot(), batched.histograms[name].snapshot()
        assert np.array_equal(ca, cb) and np.allclose(sa, sb)
