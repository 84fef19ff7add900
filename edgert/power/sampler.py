"""A thread that reads a power meter at a fixed rate and turns readings into watts, joules and mJ/frame.

Energy per rail comes from the meter's hardware counter when it has one (NVML, RAPL, INA228) and from
the trapezoid rule over the samples otherwise. Frames are counted by the pipeline (``frame_done()`` or
``add_frames(n)``); each sample records the frame count at the moment it was taken, so energy and
frames are measured over the same interval (first sample to last) and mJ/frame is their ratio.

Usage::

    with PowerSampler(open_meter("auto"), hz=10) as s:
        for frame in frames:
            ...
            s.frame_done()
    s.summary()  # {"avg_w", "peak_w", "energy_j", "per_rail": {...}, "mj_per_frame", ...}
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from edgert.errors import EdgertError, PowerError
from edgert.power.meter import PowerMeter, PowerReading

__all__ = ["PowerSampler", "Sample"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    reading: PowerReading
    frames: int  # the frame counter when the reading was taken


class _RailStats:
    def __init__(self) -> None:
        self.energy_j = 0.0
        self.peak_w = float("-inf")
        self.counter0: float | None = None
        self.counter: float | None = None


class PowerSampler:
    """Samples ``meter`` every ``1/hz`` seconds on a daemon thread between :meth:`start` and :meth:`stop`.

    ``on_sample(sample)`` (optional) runs on the sampler thread after each reading; the budget
    controller uses it. A meter that cannot measure (the null meter) starts no thread; its
    :meth:`summary` carries the reason and ``None`` figures.
    """

    def __init__(
        self,
        meter: PowerMeter,
        hz: float = 10.0,
        on_sample: Callable[[Sample], None] | None = None,
        history_s: float = 3600.0,
    ) -> None:
        if hz <= 0:
            raise PowerError(f"sample rate must be > 0 Hz, got {hz}")
        self.meter = meter
        self.hz = float(hz)
        self.clock = meter.clock
        self.on_sample = on_sample
        self._lock = threading.Lock()
        self._frames = 0
        self._history: collections.deque[Sample] = collections.deque(maxlen=max(2, int(history_s * hz) + 2))
        self._first: Sample | None = None
        self._last: Sample | None = None
        self._rails: dict[str, _RailStats] = {}
        self._total = _RailStats()
        self._count = 0
        self._errors = 0
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at: float | None = None
        self._stopped_at: float | None = None

    # -- frame counting (any thread) ---------------------------------------------------------------
    def frame_done(self) -> None:
        with self._lock:
            self._frames += 1

    def add_frames(self, n: int) -> None:
        with self._lock:
            self._frames += int(n)

    @property
    def frames(self) -> int:
        return self._frames

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> PowerSampler:
        if self._thread is not None or self._started_at is not None:
            return self
        self._started_at = self.clock.now()
        if not self.meter.available:
            return self
        self._sample()  # the first sample opens the interval energy and frames are measured over
        self._thread = threading.Thread(target=self._run, name="edgert-power-sampler", daemon=True)
        self.clock.register(self._thread)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._started_at is None or self._stopped_at is not None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 3.0 / self.hz))
            self._sample()  # the last sample closes the interval, after every counted frame
        self._stopped_at = self.clock.now()

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        period = 1.0 / self.hz
        next_t = self.clock.now() + period
        while not self.clock.wait(self._stop, next_t - self.clock.now()):
            self._sample()
            next_t += period
            now = self.clock.now()
            if next_t < now:  # fell behind (a slow meter): skip, do not burst
                next_t = now + period

    def _sample(self) -> None:
        try:
            reading = self.meter.read()
        except EdgertError as exc:
            self._note_error(str(exc))
            return
        except OSError as exc:
            self._note_error(f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            sample = Sample(reading, self._frames)
            self._count += 1
            prev = self._last
            self._accumulate(prev, sample)
            if self._first is None:
                self._first = sample
            self._last = sample
            self._history.append(sample)
        if self.on_sample is not None:
            self.on_sample(sample)

    def _note_error(self, message: str) -> None:
        with self._lock:
            self._errors += 1
            first = self._last_error is None
            self._last_error = message
        if first:
            log.warning("power meter read failed: %s", message)

    def _accumulate(self, prev: Sample | None, cur: Sample) -> None:
        r = cur.reading
        total_counter = self._total_counter(r)
        for name, w in r.watts.items():
            st = self._rails.setdefault(name, _RailStats())
            st.peak_w = max(st.peak_w, w)
            counter = r.energy_j.get(name)
            if counter is not None:
                if st.counter0 is None:
                    st.counter0 = counter
                st.counter = counter
            elif prev is not None and name in prev.reading.watts:
                dt = r.time - prev.reading.time
                st.energy_j += 0.5 * (w + prev.reading.watts[name]) * max(dt, 0.0)
        t = self._total
        t.peak_w = max(t.peak_w, r.total_w)
        if total_counter is not None:
            if t.counter0 is None:
                t.counter0 = total_counter
            t.counter = total_counter
        elif prev is not None:
            dt = r.time - prev.reading.time
            t.energy_j += 0.5 * (r.total_w + prev.reading.total_w) * max(dt, 0.0)

    def _total_counter(self, r: PowerReading) -> float | None:
        rails = self.meter.total_rails
        if rails and all(name in r.energy_j for name in rails):
            return float(sum(r.energy_j[name] for name in rails))
        return None

    # -- results ----------------------------------------------------------------------------------
    def latest(self) -> Sample | None:
        return self._last

    def samples(self) -> list[Sample]:
        """The samples kept (the last ``history_s`` seconds), oldest first."""
        with self._lock:
            return list(self._history)

    def moving_average(self, window_s: float, rail: str | None = None) -> float | None:
        """Time-weighted mean of ``rail`` (None: total) over the last ``window_s`` seconds of samples."""
        with self._lock:
            if not self._history:
                return None
            end = self._history[-1].reading.time
            start = end - window_s
            pts = []
            for s in reversed(self._history):
                pts.append((s.reading.time, s.reading.rail(rail)))
                if s.reading.time <= start:
                    break
        pts.reverse()
        if len(pts) == 1:
            return pts[0][1]
        area = 0.0
        span = 0.0
        for (t0, w0), (t1, w1) in zip(pts, pts[1:]):
            a = max(t0, start)
            if t1 <= a:
                continue
            # the segment's value at a (linear between the two samples)
            wa = w0 + (w1 - w0) * (a - t0) / (t1 - t0) if t1 > t0 else w1
            area += 0.5 * (wa + w1) * (t1 - a)
            span += t1 - a
        return area / span if span > 0 else pts[-1][1]

    def _energy(self, st: _RailStats) -> float:
        if st.counter is not None and st.counter0 is not None:
            return st.counter - st.counter0
        return st.energy_j

    def summary(self) -> dict[str, Any]:
        """Figures over the sampled interval; watts and joules are ``None`` when nothing was measured."""
        with self._lock:
            first, last = self._first, self._last
            frames_total = self._frames
            rails = dict(self._rails)
            total = self._total
            errors, last_error = self._errors, self._last_error
            count = self._count
        out: dict[str, Any] = {
            "meter": self.meter.kind,
            "available": self.meter.available,
            "description": self.meter.description,
            "sample_hz": self.hz,
            "samples": 0,
            "duration_s": None,
            "avg_w": None,
            "peak_w": None,
            "energy_j": None,
            "per_rail": {},
            "frames": frames_total,
            "mj_per_frame": None,
            "errors": errors,
        }
        if last_error:
            out["last_error"] = last_error
        if first is None or last is None:
            if self._started_at is not None:
                end = self._stopped_at if self._stopped_at is not None else self.clock.now()
                out["duration_s"] = end - self._started_at
            return out
        duration = last.reading.time - first.reading.time
        out["duration_s"] = duration
        out["samples"] = count
        energy = self._energy(total)
        if duration > 0:
            out["avg_w"] = energy / duration
            out["energy_j"] = energy
        else:
            out["avg_w"] = last.reading.total_w
            out["energy_j"] = 0.0
        out["peak_w"] = total.peak_w
        for name, st in rails.items():
            e = self._energy(st)
            out["per_rail"][name] = {
                "avg_w": e / duration if duration > 0 else last.reading.watts.get(name),
                "peak_w": st.peak_w,
                "energy_j": e if duration > 0 else 0.0,
            }
        frames = last.frames - first.frames
        out["frames_measured"] = frames
        if frames > 0 and duration > 0:
            out["mj_per_frame"] = energy * 1000.0 / frames
            out["fps"] = frames / duration
        return out
