"""Live pipeline statistics: frames, FPS, drops and per-stage latency percentiles.

One :class:`PipelineStats` belongs to a running pipeline. The pipeline's threads write it; observers,
the web preview and the final summary read it. Latencies go into fixed rings of preallocated float64
arrays (the last :data:`WINDOW` frames per stage), so recording a frame allocates nothing; percentiles
are computed only when someone asks.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

__all__ = ["LATENCY_BUCKETS", "STAGES", "WINDOW", "LatencyHistogram", "LatencyRing", "PipelineStats",
           "latency_buckets", "merged_quantiles_ms"]

#: Stage names in pipeline order; ``total`` is capture start to sinks handed the frame.
STAGES: tuple[str, ...] = ("capture", "preprocess", "infer", "postprocess", "sinks", "total")

#: How many recent frames the latency percentiles and the live FPS cover.
WINDOW = 1024


class LatencyRing:
    """The last ``size`` durations (seconds) of one stage, in a preallocated array."""

    def __init__(self, size: int = WINDOW) -> None:
        self._values = np.zeros(size, dtype=np.float64)
        self._count = 0
        self._sum = 0.0

    def add(self, seconds: float) -> None:
        self._values[self._count % self._values.shape[0]] = seconds
        self._count += 1
        self._sum += seconds

    def add_many(self, seconds: np.ndarray) -> None:
        """Several durations at once, in order (a batch's frames): as many :meth:`add` calls, in a few numpy calls."""
        values = np.asarray(seconds, np.float64).reshape(-1)
        size = self._values.shape[0]
        m = values.shape[0]
        if not m:
            return
        total = float(values.sum())
        if m > size:  # only the last ``size`` stay in the window, as with one add each
            self._count += m - size
            values = values[-size:]
            m = size
        self._values[(self._count + np.arange(m)) % size] = values
        self._count += m
        self._sum += total

    @property
    def count(self) -> int:
        return self._count

    def window(self) -> np.ndarray:
        """A copy of the recent values (the writer may be filling the ring meanwhile)."""
        return self._values[: min(self._count, self._values.shape[0])].copy()

    def quantiles_ms(self) -> dict[str, float]:
        """p50/p95/p99 and mean of the window in milliseconds (zeros before the first frame)."""
        return _quantiles_ms(self.window())


#: Upper bounds (seconds) of the latency histogram's buckets: 1 ms to 10 s, for a Jetson Nano's 300 ms
#: frames as for a desktop GPU's 2 ms ones. Fixed, so every board of a fleet aggregates (Prometheus sums buckets).
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _HistogramBank:
    """Every source's histogram in one array (source, stage, bucket), so a batch of frames of many sources is
    counted in one numpy call, not one per source (the results thread, docs/results/README.md: host calls)."""

    def __init__(self) -> None:
        self.counts = np.zeros((0, len(STAGES), len(LATENCY_BUCKETS) + 1), np.int64)  # the last column: above all
        self.sums = np.zeros((0, len(STAGES)), np.float64)
        self.lock = threading.Lock()

    def new_row(self) -> int:
        with self.lock:
            row = self.counts.shape[0]
            self.counts = np.concatenate([self.counts, np.zeros((1, *self.counts.shape[1:]), np.int64)])
            self.sums = np.concatenate([self.sums, np.zeros((1, len(STAGES)), np.float64)])
        return row


class LatencyHistogram:
    """Counts of every frame's stage latencies per bucket, since start (the window above forgets; this does not).

    One per source (a row of its :class:`PipelineStats`'s bank, or its own); the result thread writes it, the
    metrics endpoint reads a copy (:meth:`snapshot`).
    """

    def __init__(self, bank: _HistogramBank | None = None) -> None:
        self._bounds = np.asarray(LATENCY_BUCKETS, np.float64)
        self.bank = bank if bank is not None else _HistogramBank()
        self.row = self.bank.new_row()
        self._rows = np.arange(len(STAGES))

    def add(self, timings: np.ndarray) -> None:
        """One frame's seconds per stage, in :data:`STAGES` order."""
        t = np.asarray(timings, np.float64)[: len(STAGES)]
        slot = np.searchsorted(self._bounds, t, side="left")  # first bound >= t: Prometheus's le is inclusive
        bank = self.bank
        with bank.lock:
            bank.counts[self.row, np.arange(t.shape[0]), slot] += 1
            bank.sums[self.row, : t.shape[0]] += t

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """(cumulative counts per stage and bucket, the last column being +Inf; sums per stage)."""
        bank = self.bank
        with bank.lock:
            return np.cumsum(bank.counts[self.row], axis=1), bank.sums[self.row].copy()


def latency_buckets(timings: np.ndarray) -> np.ndarray:
    """Each value's histogram bucket (the first bound >= it, as :meth:`LatencyHistogram.add`), same shape."""
    return np.searchsorted(np.asarray(LATENCY_BUCKETS, np.float64), timings, side="left")


def _quantiles_ms(window: np.ndarray) -> dict[str, float]:
    if window.size == 0:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "mean": 0.0}
    p50, p95, p99 = np.percentile(window, [50, 95, 99]) * 1000.0
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3), "p99": round(float(p99), 3),
            "mean": round(float(window.mean()) * 1000.0, 3)}


def merged_quantiles_ms(rings: list[LatencyRing]) -> dict[str, float]:
    """Quantiles over the recent values of several rings together (one stage on several slots)."""
    windows = [r.window() for r in rings]
    return _quantiles_ms(np.concatenate(windows) if windows else np.zeros(0))


class PipelineStats:
    """Counters of one pipeline run, safe to read from any thread.

    ``frames`` counts frames that went through every stage; ``dropped`` counts frames that never will
    (stale live frames) plus frames a slow sink skipped, by reason in ``drops``. Frames a damaged file
    could not decode are not drops: the run summary counts them apart, in ``undecodable``.
    ``watts`` is filled by a power meter when one runs (the power helper sets it); None otherwise.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.frames = 0
        self.detections = 0
        self.watts: float | None = None
        self.analytics_counts: dict[str, Any] | None = None  # counting lines and zones, for the metrics endpoint
        #: a speech run's figures (RTF per stage, Whisper's queue, events per kind), for the metrics endpoint
        self.speech: dict[str, Any] | None = None
        #: the model update door's state (edgert.pipeline.update_door), for the metrics endpoint
        self.model_update: dict[str, Any] | None = None
        #: per-source figures (name -> frames, fps, dropped, reconnects), refreshed by the pipeline every few frames
        self.sources: dict[str, dict[str, float]] = {}
        self.drops: dict[str, int] = {}
        self.latency: dict[str, LatencyRing] = {stage: LatencyRing() for stage in STAGES}
        #: since-start latency histograms and event counts per source, for the metrics endpoint
        self.histograms: dict[str, LatencyHistogram] = {}
        self._bank = _HistogramBank()  # their counts, all sources in one array
        self._batch_sources: list[str] = []  # record_latencies: the last batch's sources, their rows in the bank
        self._batch_rows = np.zeros((0, 1), np.intp)
        self._batch_distinct = True
        self._stage_rows = np.arange(len(STAGES))
        self.events: dict[tuple[str, str], int] = {}  # (source, event type) -> count
        self.analytics_by_source: dict[str, Any] = {}  # source -> Analytics.counts()
        #: board telemetry beside the watts (temperatures, clocks, throttling), set by the power sampler
        self.telemetry: dict[str, Any] | None = None
        self.started_at: float | None = None  # perf_counter at the first admitted frame
        self.first_done_at: float | None = None  # perf_counter when the first frame came out
        self.last_done_at: float | None = None
        self._done_times = np.zeros(64, dtype=np.float64)  # completion times for the live FPS

    # -- writers (pipeline threads) -----------------------------------------------------------------
    def mark_started(self) -> None:
        if self.started_at is None:
            self.started_at = time.perf_counter()

    def record_frame(self, timings: np.ndarray, detections: int, source: str = "",
                     events: list[dict[str, Any]] | None = None) -> None:
        """One frame done; ``timings`` holds seconds per stage in :data:`STAGES` order; ``source`` is its
        source's name and ``events`` the frame's analytics events (counted by type for the endpoint)."""
        now = time.perf_counter()
        for stage, seconds in zip(STAGES, timings.tolist()):
            self.latency[stage].add(seconds)
        self._histogram(source).add(timings)
        self.count_frame(detections, source, events, now)

    def _histogram(self, source: str) -> LatencyHistogram:
        hist = self.histograms.get(source)
        if hist is None:
            hist = self.histograms[source] = LatencyHistogram(self._bank)
        return hist

    def record_latencies(self, timings: np.ndarray, sources: list[str]) -> None:
        """The stage latencies of a batch of frames at once: ``timings`` (n, stages) in :data:`STAGES` order, row
        ``i`` of source ``sources[i]``. Each frame is then counted by :meth:`count_frame`; together they are
        :meth:`record_frame` per frame, in a fixed number of numpy calls per batch and one per source."""
        t = np.asarray(timings, np.float64)[:, : len(STAGES)]
        for k, stage in enumerate(STAGES):
            self.latency[stage].add_many(t[:, k])
        buckets = latency_buckets(t)
        if sources != self._batch_sources:  # a run's batches mostly come in the same order of sources
            self._batch_rows = np.asarray([self._histogram(s).row for s in sources], np.intp)[:, None]
            self._batch_sources = list(sources)
            self._batch_distinct = len(set(sources)) == len(sources)
        bank, stages = self._bank, self._stage_rows[None, : t.shape[1]]
        with bank.lock:
            if self._batch_distinct:  # one frame per source: no index twice, a plain fancy add
                bank.counts[self._batch_rows, stages, buckets] += 1
                bank.sums[self._batch_rows, stages] += t
            else:
                np.add.at(bank.counts, (self._batch_rows, stages, buckets), 1)
                np.add.at(bank.sums, (self._batch_rows, stages), t)

    def count_frame(self, detections: int, source: str = "", events: list[dict[str, Any]] | None = None,
                    now: float | None = None) -> None:
        """One frame done whose latencies :meth:`record_latencies` took: its detections and events, the counters."""
        if now is None:
            now = time.perf_counter()
        for event in events or ():
            key = (source, str(event.get("type", "event")))
            self.events[key] = self.events.get(key, 0) + 1
        with self._lock:
            self._done_times[self.frames % self._done_times.shape[0]] = now
            self.frames += 1
            self.detections += detections
            if self.first_done_at is None:
                self.first_done_at = now
            self.last_done_at = now

    def set_drops(self, reason: str, count: int) -> None:
        """Set a drop counter that another object keeps (a source's stale frames, a sink's skips)."""
        with self._lock:
            self.drops[reason] = int(count)

    # -- readers ------------------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        with self._lock:
            return sum(self.drops.values())

    @property
    def fps(self) -> float:
        """Frames per second over the last up to 64 frames (live); 0.0 before two frames are done."""
        with self._lock:
            n = min(self.frames, self._done_times.shape[0])
            if n < 2:
                return 0.0
            newest = self._done_times[(self.frames - 1) % self._done_times.shape[0]]
            oldest = self._done_times[(self.frames - n) % self._done_times.shape[0]]
        span = float(newest - oldest)
        return (n - 1) / span if span > 0 else 0.0

    @property
    def average_fps(self) -> float:
        """Frames per second from the first frame out to the last (excludes model load and warm-up)."""
        with self._lock:
            frames, first, last = self.frames, self.first_done_at, self.last_done_at
        if frames < 2 or first is None or last is None or last <= first:
            return 0.0
        return (frames - 1) / (last - first)

    def latency_ms(self) -> dict[str, dict[str, float]]:
        return {stage: ring.quantiles_ms() for stage, ring in self.latency.items()}

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready picture of now (the web preview's /stats.json)."""
        with self._lock:
            drops = dict(self.drops)
            frames, detections = self.frames, self.detections
        return {
            "frames": frames,
            "fps": round(self.fps, 2),
            "average_fps": round(self.average_fps, 2),
            "dropped": sum(drops.values()),
            "drops": drops,
            "detections": detections,
            "latency_ms": self.latency_ms(),
            "watts": None if self.watts is None else round(float(self.watts), 3),
            "telemetry": self.telemetry,  # temperatures, clocks, throttling (None: the board shows none)
            "model_update": self.model_update,  # the update door's state (None: the run takes no updates)
        }
