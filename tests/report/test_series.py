"""SeriesRecorder on a real PipelineStats fed frame by frame, with a test clock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgert.report.series import SeriesRecorder
from edgert.stats import STAGES, PipelineStats


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _frame(stats: PipelineStats, rec: SeriesRecorder, total_s: float) -> None:
    """One frame whose stages take total_s / 10 each, except total (total_s)."""
    timings = np.full(len(STAGES), total_s / 10)
    timings[STAGES.index("total")] = total_s
    stats.record_frame(timings, detections=1)
    rec.on_frame(stats)


def _feed(stats: PipelineStats, rec: SeriesRecorder, clock: Clock, seconds: float, fps: float,
          total_s: float = 0.01) -> None:
    for _ in range(round(seconds * fps)):
        clock.now += 1.0 / fps
        _frame(stats, rec, total_s)


def test_points_hold_interval_fps_latency_watts_and_drops() -> None:
    clock, stats = Clock(), PipelineStats()
    rec = SeriesRecorder(interval_s=1.0, clock=clock)
    rec.on_start({"stats": stats})
    _feed(stats, rec, clock, 3.0, fps=16, total_s=0.010)  # powers of two: the clock adds up exactly
    stats.watts = 7.5
    stats.set_drops("stale", 4)
    _feed(stats, rec, clock, 2.0, fps=64, total_s=0.030)
    rec.on_stop({})
    d = rec.to_dict()
    assert d["points"] == len(d["t"]) == len(d["fps"]) == 5
    assert d["fps"] == pytest.approx([16, 16, 16, 64, 64])
    total = d["latency_ms"]["total"]
    # each point's percentiles are over ITS frames only, not the whole ring
    assert total["p50"][:3] == pytest.approx([10, 10, 10]) and total["p50"][3:] == pytest.approx([30, 30])
    assert d["latency_ms"]["infer"]["p99"][4] == pytest.approx(3.0)
    assert d["watts"][:3] == [None, None, None] and d["watts"][4] == 7.5
    assert d["dropped"][-1] == 4 and d["frames"][-1] == stats.frames == 176
    assert d["t"] == pytest.approx([1, 2, 3, 4, 5])


def test_a_stall_shows_as_a_dip_not_as_the_last_good_rate() -> None:
    clock, stats = Clock(), PipelineStats()
    rec = SeriesRecorder(interval_s=1.0, clock=clock)
    rec.on_start({"stats": stats})
    _feed(stats, rec, clock, 2.0, fps=32)
    clock.now += 9.0  # nothing for 9 s, then one frame
    _frame(stats, rec, 0.01)
    d = rec.to_dict()
    assert stats.fps > 25  # the live figure still says 30 fps ...
    assert d["fps"][-1] < 1.0  # ... the series says what happened in that interval
    assert d["t"][-1] - d["t"][-2] == pytest.approx(9.0)


def test_memory_is_fixed_and_resolution_halves_when_full() -> None:
    clock, stats = Clock(), PipelineStats()
    rec = SeriesRecorder(interval_s=1.0, max_points=8, clock=clock)
    rec.on_start({"stats": stats})
    arrays = [rec._t, rec._fps, rec._p50, rec._p99, rec._watts]
    # 4 s at 8 fps with 5 ms, then 4 s at 32 fps with 20 ms and one 100 ms spike (at 5.6 s)
    _feed(stats, rec, clock, 4.0, fps=8, total_s=0.005)
    for i in range(128):
        clock.now += 1 / 32
        _frame(stats, rec, 0.1 if i == 50 else 0.02)
    assert len(rec) == 8 and rec.interval_s == 1.0
    _feed(stats, rec, clock, 1.0, fps=32, total_s=0.02)  # the ninth point: merge first
    d = rec.to_dict()
    assert d["points"] == 5 and d["interval_s"] == 2.0 and d["merges"] == 1
    assert all(a is b for a, b in zip(arrays, [rec._t, rec._fps, rec._p50, rec._p99, rec._watts]))
    assert d["t"] == pytest.approx([2, 4, 6, 8, 9])
    assert d["fps"] == pytest.approx([8, 8, 32, 32, 32])
    # the spike at 5.6 s is in the third point (4-6 s): the merged p99 keeps it
    p99 = d["latency_ms"]["total"]["p99"]
    assert p99[2] > 50 and p99[3] == pytest.approx(20)
    assert d["latency_ms"]["total"]["p50"][:2] == pytest.approx([5, 5])
    for _ in range(10):  # much longer: still at most 8 points
        _feed(stats, rec, clock, 8.0, fps=8)
    rec.on_stop({})  # the frames since the last point make one more
    d = rec.to_dict()
    assert len(rec) <= 8 and rec.interval_s >= 16
    assert d["t"][-1] == pytest.approx(89.0) and d["frames"][-1] == stats.frames
    assert sum(1 for v in d["fps"] if v is not None and math.isclose(v, 8, rel_tol=0.01)) >= 4


def test_merged_fps_is_frames_over_time() -> None:
    clock, stats = Clock(), PipelineStats()
    rec = SeriesRecorder(interval_s=1.0, max_points=4, clock=clock)
    rec.on_start({"stats": stats})
    for fps in (8, 32, 16, 64, 8):
        _feed(stats, rec, clock, 1.0, fps=fps)
    d = rec.to_dict()
    # (8 + 32) frames over 2 s, (16 + 64) over 2 s, then the fifth point alone
    assert d["fps"] == pytest.approx([20, 40, 8])


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        SeriesRecorder(max_points=7)
    with pytest.raises(ValueError):
        SeriesRecorder(interval_s=0)
