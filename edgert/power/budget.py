"""Run a pipeline under a power budget by pacing how fast frames are admitted.

The pipeline calls the controller (``admit()``) before it admits each frame; the call sleeps as long as
needed to hold the admitted frame rate at the controller's current rate ``r``. A :class:`PowerSampler`
reads the meter at ``sample_hz`` and, after every reading, the controller updates ``r``.

Control law (integral action on the logarithm of the rate)::

    W      = reading of the chosen rail (the whole board by default)
    P     <- P + (1 - exp(-dt / smooth_s)) * (W - P)        # exponential smoothing, dt: time since last reading
    S      = budget_w * (1 - margin)                        # the setpoint, a little under the budget
    e      = clamp((S - P) / S, -1, 1)                      # relative error
    r     <- r * exp(gain * dt * e)
    r     <- clamp(r, min_fps, min(max_fps, 2 * achieved_fps + 1))   # achieved: frames admitted in the last second

Why this form: a board draws roughly ``idle + J * r``; the loop gain of a log-rate integrator is then
``gain * (P - idle) / S``, at most ``gain``, whatever the board's scale (a 7 W Orin Nano or a 700 W
H200), so one set of parameters fits all. Integral action drives P to S with no steady-state error,
which is the highest rate the budget allows. The rate starts at ``start_fps`` and rises (a slow start,
so a run never begins over budget); the cap at twice the achieved rate keeps the integrator from
winding up when the pipeline, not the budget, is the limit.

Defaults: ``gain = 1.0`` /s, ``smooth_s = 0.5``, ``margin = 0.03``, ``start_fps = 2``, ``min_fps = 0.2``;
they settle a simulated board with a measurement lag of 0.3-1 s in about 10 s (tests/power/test_budget.py).
The budget is judged on the moving average over ``window_s = 5`` seconds: ``stats()`` reports the
fraction of time that average was over the budget (counted once the first window has filled), the
average watts and the admitted frame rate.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from types import TracebackType
from typing import Any

from edgert.config import PowerConfig
from edgert.errors import PowerError
from edgert.power.meter import PowerMeter
from edgert.power.sampler import PowerSampler, Sample

__all__ = ["BudgetController", "budget_admission"]

log = logging.getLogger(__name__)

_ACHIEVED_WINDOW_S = 1.0  # the admitted frame rate is counted over the last second


class BudgetController:
    """Paces frame admission so the moving-average power of ``rail`` stays at or under ``budget_w``.

    Callable: ``controller()`` is ``controller.admit()``. Starts its sampler on the first admit (or
    :meth:`start`); :meth:`close` stops it. :meth:`stats` is for the run summary.
    """

    def __init__(
        self,
        meter: PowerMeter,
        budget_w: float,
        rail: str | None = None,
        sample_hz: float = 10.0,
        window_s: float = 5.0,
        gain: float = 1.0,
        margin: float = 0.03,
        start_fps: float = 2.0,
        min_fps: float = 0.2,
        max_fps: float | None = None,
        smooth_s: float = 0.5,
        owns_meter: bool = False,
    ) -> None:
        if budget_w <= 0:
            raise PowerError(f"power budget must be > 0 W, got {budget_w}")
        if not meter.available:
            raise PowerError(f"a power budget needs a power meter: {meter.description}")
        meter.check_rail(rail)
        if not 0 <= margin < 0.5 or gain <= 0 or window_s <= 0 or min_fps <= 0 or start_fps <= 0:
            raise PowerError("budget controller: need 0 <= margin < 0.5 and gain, window_s, min_fps, start_fps > 0")
        self.meter = meter
        self.clock = meter.clock
        self.budget_w = float(budget_w)
        self.rail = None if rail in (None, "total") else rail
        self.window_s = float(window_s)
        self.gain = float(gain)
        self.margin = float(margin)
        self.setpoint_w = self.budget_w * (1.0 - self.margin)
        self.min_fps = float(min_fps)
        self.max_fps = float(max_fps) if max_fps else math.inf
        self._rate = min(max(float(start_fps), self.min_fps), self.max_fps)
        self._lock = threading.Lock()
        self._next_admit: float | None = None
        self._admitted: collections.deque[float] = collections.deque()  # admit times within one window
        self._last_update: float | None = None
        self._t0: float | None = None
        self._over_s = 0.0
        self._judged_s = 0.0
        self._moving_avg: float | None = None
        self.smooth_s = float(smooth_s)
        self._smoothed: float | None = None  # what the loop acts on: an EMA of readings
        self._achieved: float | None = None
        self.sampler = PowerSampler(meter, hz=sample_hz, on_sample=self._update)
        self._owns_meter = owns_meter  # opened for us by budget_admission: close it with the controller
        self._started = False
        self._closed = False

    # -- the pipeline's side ----------------------------------------------------------------------
    def start(self) -> BudgetController:
        with self._lock:
            if self._started:
                return self
            self._started = True
            self._t0 = self.clock.now()
        self.sampler.start()
        return self

    def admit(self) -> None:
        """Block until the next frame may be admitted at the current rate, then count it."""
        if not self._started:
            self.start()
        with self._lock:
            now = self.clock.now()
            interval = 1.0 / self._rate
            # No credit for idle time beyond one frame: a stalled pipeline may not burst afterwards.
            slot = now if self._next_admit is None else max(self._next_admit, now - interval)
            self._next_admit = slot + interval
            delay = slot - now
        if delay > 0:
            self.clock.sleep(delay)
        with self._lock:
            t = max(slot, now)
            self._admitted.append(t)
            while self._admitted[0] < t - 2 * _ACHIEVED_WINDOW_S:  # bounded even if no reading arrives
                self._admitted.popleft()
        self.sampler.frame_done()

    __call__ = admit

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.sampler.stop()
            if self._owns_meter:
                self.meter.close()

    def __enter__(self) -> BudgetController:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the control loop (sampler thread) --------------------------------------------------------
    def _update(self, sample: Sample) -> None:
        now = sample.reading.time
        avg = self.sampler.moving_average(self.window_s, self.rail)
        if avg is None:
            return
        watts = sample.reading.rail(self.rail)
        with self._lock:
            prev = self._last_update
            self._last_update = now
            self._moving_avg = avg
            if self._smoothed is None or prev is None:
                self._smoothed = watts
            else:
                k = 1.0 - math.exp(-max(now - prev, 0.0) / self.smooth_s) if self.smooth_s > 0 else 1.0
                self._smoothed += k * (watts - self._smoothed)
            while self._admitted and self._admitted[0] < now - _ACHIEVED_WINDOW_S:
                self._admitted.popleft()
            t0 = self._t0 if self._t0 is not None else now
            if now - t0 >= _ACHIEVED_WINDOW_S:
                self._achieved = len(self._admitted) / _ACHIEVED_WINDOW_S
            window_full = now - t0 >= self.window_s
            if prev is None:
                return
            dt = now - prev
            if dt <= 0:
                return
            if window_full:
                self._judged_s += dt
                if avg > self.budget_w:
                    self._over_s += dt
            signal = self._smoothed
            e = max(-1.0, min(1.0, (self.setpoint_w - signal) / self.setpoint_w))
            rate = self._rate * math.exp(self.gain * dt * e)
            cap = self.max_fps
            if self._achieved is not None:
                cap = min(cap, 2.0 * self._achieved + 1.0)
            self._rate = max(self.min_fps, min(rate, max(cap, self.min_fps)))

    # -- reporting --------------------------------------------------------------------------------
    @property
    def over_budget(self) -> bool:
        """Whether the smoothed reading is above the setpoint now (a processor that sheds work asks this)."""
        with self._lock:
            return self._smoothed is not None and self._smoothed > self.setpoint_w

    @property
    def rate(self) -> float:
        """The admission rate (frames per second) the controller currently allows."""
        return self._rate

    def stats(self) -> dict[str, Any]:
        """Budget, watts, fraction of time over budget and frame rates, for the run summary."""
        s = self.sampler.summary()
        with self._lock:
            judged, over = self._judged_s, self._over_s
            out: dict[str, Any] = {
                "budget_w": self.budget_w,
                "rail": self.rail or "total",
                "setpoint_w": self.setpoint_w,
                "avg_w": s["avg_w"],
                "peak_w": s["peak_w"],
                "energy_j": s["energy_j"],
                "moving_avg_w": self._moving_avg,
                "over_budget_fraction": over / judged if judged > 0 else None,
                "admitted_fps": s.get("fps"),
                "settled_fps": self._achieved,
                "rate_fps": self._rate,
                "at_min_rate": self._rate <= self.min_fps * 1.0001,
                "frames": s["frames"],
                "mj_per_frame": s["mj_per_frame"],
                "duration_s": s["duration_s"],
                "meter": self.meter.kind,
                "meter_errors": s["errors"],
                "control": {"window_s": self.window_s, "gain": self.gain, "margin": self.margin,
                            "sample_hz": self.sampler.hz},
            }
        return out


def budget_admission(power_config: PowerConfig, meter: PowerMeter | None = None) -> BudgetController | None:
    """The admission hook for a pipeline run: ``None`` when the config sets no budget.

    The returned controller is the ``admit()`` callable (call it before admitting each frame); call its
    ``stats()`` for the run summary and ``close()`` at the end of the run. Without ``meter`` it opens
    ``power_config.meter`` and raises :class:`PowerError` when that cannot measure anything here.
    """
    if power_config.budget_w is None:
        return None
    owns = meter is None
    if meter is None:
        from edgert.power.meters import open_meter

        meter = open_meter(power_config.meter)
    if not meter.available:
        raise PowerError(f"--power-budget needs a power meter, and there is none here: {meter.description}")
    try:
        return BudgetController(meter, power_config.budget_w, rail=power_config.rail,
                                sample_hz=power_config.sample_hz, owns_meter=owns)
    except PowerError:
        if owns:
            meter.close()
        raise
