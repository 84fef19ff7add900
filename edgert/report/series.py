"""A bounded time series of a running pipeline: FPS, per-stage latency p50/p99, watts and drops.

:class:`SeriesRecorder` is an observer. From the pipeline's progress (``on_frame``) it takes a point
about once per ``interval_s``: the frames completed in that interval over its length (so a stall shows
as a dip, not as the last good rate), the p50 and p99 of each stage's latency over the frames of that
interval, the live watts and the drop counter. Points go into preallocated arrays of ``max_points``;
when they are full, neighbouring points are merged in pairs and the interval doubles, so a run of days
keeps the same memory as a run of minutes, at a coarser resolution (merged p50s are averaged weighted
by frames, p99s keep the larger one so a latency spike never disappears).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgert.pipeline.observer import BaseObserver
from edgert.stats import STAGES, LatencyRing, PipelineStats

__all__ = ["SeriesRecorder"]


def _interval_quantiles(ring: LatencyRing, since: int) -> tuple[float, float]:
    """(p50, p99) in ms of the durations ``ring`` recorded after its count was ``since`` (NaN: none).

    The ring keeps the last WINDOW durations; an interval with more frames than that is measured on
    its newest WINDOW. Without access to the ring's values, the whole window's quantiles stand in.
    """
    count = ring.count
    new = count - since
    if new <= 0:
        return math.nan, math.nan
    values = getattr(ring, "_values", None)
    if not isinstance(values, np.ndarray):
        q = ring.quantiles_ms()
        return q["p50"], q["p99"]
    size = values.shape[0]
    n = min(new, size)
    window = values[np.arange(count - n, count) % size]  # fancy indexing copies: the writer may go on
    p50, p99 = np.percentile(window, [50, 99]) * 1000.0
    return float(p50), float(p99)


class SeriesRecorder(BaseObserver):
    """Samples the live :class:`PipelineStats` into fixed-size arrays (see the module docstring).

    ``clock`` is injectable for tests; it must be the clock the intervals are measured in (seconds).
    The arrays may be read (:meth:`to_dict`) from any thread while the pipeline runs.
    """

    def __init__(self, interval_s: float = 1.0, max_points: int = 1024,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if max_points < 4 or max_points % 2:
            raise ValueError("max_points must be an even number >= 4")
        self.interval_s = float(interval_s)
        self.max_points = int(max_points)
        self.clock = clock
        self._lock = threading.Lock()
        n, s = self.max_points, len(STAGES)
        self._t = np.zeros(n, np.float64)  # end of each point's interval, seconds since on_start
        self._frames = np.zeros(n, np.int64)  # frames completed by then (cumulative)
        self._dropped = np.zeros(n, np.int64)  # drops by then (cumulative)
        self._fps = np.zeros(n, np.float64)
        self._watts = np.full(n, np.nan, np.float64)
        self._temp = np.full(n, np.nan, np.float64)  # the hottest thermal zone (board telemetry), C
        self._p50 = np.full((n, s), np.nan, np.float64)
        self._p99 = np.full((n, s), np.nan, np.float64)
        # a speech run: seconds of audio through the chain and busy seconds by then (cumulative), for its RTF
        self._audio = np.full(n, np.nan, np.float64)
        self._busy = np.full(n, np.nan, np.float64)
        self._n = 0
        self._stats: PipelineStats | None = None
        self._t0 = 0.0
        self._base_frames = 0  # frames at on_start: the first interval starts there
        self._last_t = 0.0  # clock at the previous point
        self._last_frames = 0
        self._last_counts = [0] * s  # each stage ring's count at the previous point
        self._merges = 0
        # per source (a run with several): cumulative frames and drops at each point, from stats.sources
        self._src_frames: dict[str, np.ndarray] = {}
        self._src_dropped: dict[str, np.ndarray] = {}

    # -- observer -----------------------------------------------------------------------------------
    def on_start(self, info: dict[str, Any]) -> None:
        stats = info.get("stats")
        if isinstance(stats, PipelineStats):
            self.start(stats)

    def on_frame(self, stats: PipelineStats) -> None:
        if self._stats is None:
            self.start(stats)  # attached without on_start (or on_start had no stats)
            return
        now = self.clock()
        if now - self._last_t >= self.interval_s:
            self.sample(now)

    on_frames = on_frame  # by the clock: a batch at once samples the same points (edgert.pipeline.observer)

    def on_stop(self, summary: dict[str, Any]) -> None:
        if self._stats is not None and self._stats.frames > self._last_frames:
            self.sample(self.clock())  # the frames after the last full interval
        self._final_sources(summary)

    def _final_sources(self, summary: dict[str, Any]) -> None:
        """The last point's per-source figures from the summary: exact, where the live ones lag."""
        with self._lock:
            i = self._n - 1
            if i < 0:
                return
            for source in summary.get("sources") or []:
                if not isinstance(source, dict) or "name" not in source:
                    continue
                name = str(source["name"])
                frames_of = self._src_frames.setdefault(name, np.zeros(self.max_points, np.int64))
                dropped_of = self._src_dropped.setdefault(name, np.zeros(self.max_points, np.int64))
                frames_of[i] = int(source.get("frames", 0))
                dropped_of[i] = int(sum((source.get("drops") or {}).values()))

    # -- recording ----------------------------------------------------------------------------------
    def start(self, stats: PipelineStats) -> None:
        """Begin at now: the first point covers the interval from here."""
        with self._lock:
            self._stats = stats
            self._t0 = self._last_t = self.clock()
            self._base_frames = self._last_frames = stats.frames
            self._last_counts = [stats.latency[stage].count for stage in STAGES]
            self._n = 0

    def sample(self, now: float | None = None) -> None:
        """Take one point now (``on_frame`` calls this once per interval)."""
        stats = self._stats
        if stats is None:
            return
        now = self.clock() if now is None else now
        frames = stats.frames
        counts = [stats.latency[stage].count for stage in STAGES]
        quantiles = [_interval_quantiles(stats.latency[stage], since)
                     for stage, since in zip(STAGES, self._last_counts)]
        watts = stats.watts
        telemetry = getattr(stats, "telemetry", None) or {}
        temps = list(dict(telemetry.get("temperatures_c") or {}).values())
        dropped = stats.dropped
        sources = dict(stats.sources)  # the pipeline replaces the dict, never edits it: a consistent snapshot
        speech = getattr(stats, "speech", None) or {}
        with self._lock:
            if self._n == self.max_points:
                self._halve()
            i = self._n
            span = now - self._last_t
            self._t[i] = now - self._t0
            self._frames[i] = frames
            self._dropped[i] = dropped
            self._fps[i] = (frames - self._last_frames) / span if span > 0 else 0.0
            self._watts[i] = math.nan if watts is None else float(watts)
            self._temp[i] = max(temps) if temps else math.nan
            self._audio[i] = float(speech.get("audio_seconds", math.nan))
            self._busy[i] = float(speech.get("busy_seconds", math.nan))
            for k, (p50, p99) in enumerate(quantiles):
                self._p50[i, k] = p50
                self._p99[i, k] = p99
            for name, figures in sources.items():
                frames_of = self._src_frames.setdefault(name, np.zeros(self.max_points, np.int64))
                dropped_of = self._src_dropped.setdefault(name, np.zeros(self.max_points, np.int64))
                frames_of[i] = int(figures.get("frames", 0))
                dropped_of[i] = int(figures.get("dropped", 0))
            self._n += 1
            self._last_t, self._last_frames, self._last_counts = now, frames, counts

    def _halve(self) -> None:
        """Merge points (0,1), (2,3), ... into one each; the interval doubles. Called with the lock held."""
        n = self._n
        h = n // 2
        a, b = np.arange(0, n, 2), np.arange(1, n, 2)
        starts = np.concatenate(([0.0], self._t[b[:-1]]))  # each merged interval begins where the last ended
        start_frames = np.concatenate(([self._base_frames], self._frames[b[:-1]]))
        span = self._t[b] - starts
        # frames in each half, for weighting the merged p50s
        fa = (self._frames[a] - start_frames).astype(np.float64)
        fb = (self._frames[b] - self._frames[a]).astype(np.float64)
        dur_a = self._t[a] - starts
        dur_b = self._t[b] - self._t[a]
        self._fps[:h] = np.where(span > 0, (self._frames[b] - start_frames) / np.where(span > 0, span, 1.0), 0.0)
        self._watts[:h] = _weighted(self._watts[a], self._watts[b], dur_a, dur_b)
        self._temp[:h] = np.fmax(self._temp[a], self._temp[b])  # the hotter: a peak never disappears
        for k in range(len(STAGES)):
            self._p50[:h, k] = _weighted(self._p50[a, k], self._p50[b, k], fa, fb)
            self._p99[:h, k] = np.fmax(self._p99[a, k], self._p99[b, k])  # fmax: NaN only where both are
        self._t[:h] = self._t[b]
        self._frames[:h] = self._frames[b]
        self._dropped[:h] = self._dropped[b]
        for arrays in (self._src_frames, self._src_dropped):
            for values in arrays.values():
                values[:h] = values[b]
                values[h:] = 0
        self._audio[:h] = self._audio[b]  # cumulative: the later point of each pair
        self._busy[:h] = self._busy[b]
        self._audio[h:] = np.nan
        self._busy[h:] = np.nan
        self._watts[h:] = np.nan
        self._temp[h:] = np.nan
        self._p50[h:] = np.nan
        self._p99[h:] = np.nan
        self._n = h
        self.interval_s *= 2.0
        self._merges += 1

    # -- reading ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def to_dict(self) -> dict[str, Any]:
        """The points as JSON-ready lists (NaN as None): t, fps, watts, frames, dropped, latency_ms."""
        with self._lock:
            n = self._n
            out: dict[str, Any] = {
                "interval_s": self.interval_s,
                "merges": self._merges,
                "points": n,
                "t": [round(float(v), 3) for v in self._t[:n]],
                "fps": _json_list(self._fps[:n]),
                "watts": _json_list(self._watts[:n]),
                "temperature_c": _json_list(self._temp[:n]),
                "frames": [int(v) for v in self._frames[:n]],
                "dropped": [int(v) for v in self._dropped[:n]],
                "latency_ms": {stage: {"p50": _json_list(self._p50[:n, k]), "p99": _json_list(self._p99[:n, k])}
                               for k, stage in enumerate(STAGES)},
                "sources": {name: self._source_points(name, n) for name in sorted(self._src_frames)},
            }
            if n and not np.isnan(self._audio[:n]).all():
                out["rtf"] = _json_list(_interval_rtf(self._audio[:n], self._busy[:n]))
        return out

    def _source_points(self, name: str, n: int) -> dict[str, Any]:
        """One source's frames, FPS (its frames over each interval) and drops at each point; lock held.

        The pipeline refreshes a source's figures every 10 of its frames, so these lag by up to 10 frames."""
        frames = self._src_frames[name][:n]
        t = self._t[:n]
        spans = np.diff(np.concatenate(([0.0], t)))
        done = np.diff(np.concatenate(([0], frames))).astype(np.float64)
        fps = np.where(spans > 0, done / np.where(spans > 0, spans, 1.0), 0.0)
        return {"frames": [int(v) for v in frames], "fps": _json_list(np.maximum(fps, 0.0)),
                "dropped": [int(v) for v in self._src_dropped[name][:n]]}


def _interval_rtf(audio: np.ndarray, busy: np.ndarray) -> np.ndarray:
    """Busy seconds per second of audio within each interval (NaN where no audio came), from cumulative figures."""
    d_audio = np.diff(np.nan_to_num(audio), prepend=0.0)
    d_busy = np.diff(np.nan_to_num(busy), prepend=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d_audio > 0, d_busy / np.where(d_audio > 0, d_audio, 1.0), np.nan)


def _weighted(x: np.ndarray, y: np.ndarray, wx: np.ndarray, wy: np.ndarray) -> np.ndarray:
    """Elementwise weighted mean of x and y, ignoring NaNs (NaN only where both are)."""
    wx = np.where(np.isnan(x), 0.0, np.maximum(wx, 0.0))
    wy = np.where(np.isnan(y), 0.0, np.maximum(wy, 0.0))
    total = wx + wy
    mean = (np.nan_to_num(x) * wx + np.nan_to_num(y) * wy) / np.where(total > 0, total, 1.0)
    # both weights zero (no frames in either half, or zero-length intervals): fall back to a plain nanmean
    plain = np.where(np.isnan(x), y, np.where(np.isnan(y), x, (x + y) / 2))
    return np.where(total > 0, mean, plain)


def _json_list(values: np.ndarray) -> list[float | None]:
    return [None if math.isnan(v) else round(v, 4) for v in values.tolist()]
