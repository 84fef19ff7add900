"""What a run adds around the pipeline, from its config and its environment.

- **power**: with ``power.budget_w`` a budget controller paces admission (its ``admit`` blocks in the
  capture stage) and reports watts; without a budget, a power sampler still fills the live watts and the
  summary's energy per frame whenever this machine has a meter (INA3221 rails or tegrastats on a Jetson,
  NVML on a desktop GPU, RAPL on a PC). This is the one place a run opens a power sampler.
- **systemd**: when ``NOTIFY_SOCKET`` is set (a ``Type=notify`` unit), READY after the first frame,
  WATCHDOG from progress, STATUS lines, STOPPING at the stop request.
- **telemetry**: where the board shows temperatures or clocks (:mod:`edgert.power.telemetry`), they are
  read every few frames into ``PipelineStats.telemetry`` (the metrics endpoint shows them) and summed up in
  the run summary's ``telemetry``, with the episodes where the board throttled itself and the FPS then.
- **metrics**: with ``runtime.metrics`` (``HOST:PORT``), a Prometheus endpoint for the run's lifetime.

``Pipeline.run()`` opens these itself, so a Python caller gets what ``edgert run`` gets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from edgert.config import PipelineConfig
from edgert.errors import EdgertError
from edgert.pipeline.observer import BaseObserver, PipelineObserver
from edgert.stats import PipelineStats

if TYPE_CHECKING:
    from edgert.pipeline.parts import JSONDict
    from edgert.power.budget import BudgetController
    from edgert.power.sampler import PowerSampler
    from edgert.power.telemetry import TelemetryWatch

__all__ = ["PowerWatts", "RunHooks", "TelemetryObserver", "open_power_sampler"]

log = logging.getLogger(__name__)

#: How often (in completed frames per source) the live watts are refreshed from the sampler's moving average.
_WATTS_EVERY = 10


def open_power_sampler(config: PipelineConfig, start: bool = True) -> PowerSampler | None:
    """A :class:`~edgert.power.sampler.PowerSampler` on ``power.meter`` (started unless ``start`` is False),
    or None when this machine has no meter."""
    from edgert.power.meters import open_meter
    from edgert.power.sampler import PowerSampler

    try:
        meter = open_meter(config.power.meter)
        if not meter.available:
            meter.close()
            return None
        sampler = PowerSampler(meter, hz=config.power.sample_hz)
        return sampler.start() if start else sampler
    except EdgertError as exc:
        log.info("no power readings: %s", exc)
        return None


class PowerWatts(BaseObserver):
    """Fills ``PipelineStats.watts`` from a sampler's one-second moving average, every few frames.

    ``count_frames``: tell the sampler about each completed frame (for millijoules per frame); a budget
    controller counts admitted frames itself.
    """

    def __init__(self, sampler: PowerSampler, rail: str | None, count_frames: bool) -> None:
        self.sampler = sampler
        self.rail = rail
        self.count_frames = count_frames
        self.every = _WATTS_EVERY
        self._seen = 0  # stats.frames at the last call

    def on_start(self, info: JSONDict) -> None:
        self.every = _WATTS_EVERY * _sources(info)

    def on_frame(self, stats: PipelineStats) -> None:
        if self.count_frames:
            self.sampler.frame_done()
        if stats.frames % self.every == 1:
            self._refresh(stats)
        self._seen = stats.frames

    def on_frames(self, stats: PipelineStats) -> None:
        """The frames since the last call, at once: counted in one call, the watts refreshed when the count
        passed a refresh point (what :meth:`on_frame` does for each frame, without a call per frame)."""
        seen, self._seen = self._seen, stats.frames
        if self.count_frames and stats.frames > seen:
            self.sampler.add_frames(stats.frames - seen)
        if _passed(seen, stats.frames, self.every):
            self._refresh(stats)

    def _refresh(self, stats: PipelineStats) -> None:
        watts = self.sampler.moving_average(1.0, self.rail)
        if watts is not None:
            stats.watts = float(watts)


#: How often (in completed frames per source) the board telemetry is read (some 20 sysfs files).
_TELEMETRY_EVERY = 30


class TelemetryObserver(BaseObserver):
    """Reads the board's telemetry every few frames into ``PipelineStats.telemetry`` and a watch."""

    def __init__(self, watch: TelemetryWatch) -> None:
        import time

        self.watch = watch
        self._clock = time.perf_counter
        self._t0 = self._clock()
        self.every = _TELEMETRY_EVERY
        self._seen = 0  # stats.frames at the last call

    def on_start(self, info: JSONDict) -> None:
        self.every = _TELEMETRY_EVERY * _sources(info)

    def on_frame(self, stats: PipelineStats) -> None:
        if stats.frames % self.every == 1:
            stats.telemetry = self.watch.update(self._clock() - self._t0, float(stats.fps))
        self._seen = stats.frames

    def on_frames(self, stats: PipelineStats) -> None:
        """The frames since the last call: read when the count passed a reading point, as :meth:`on_frame`."""
        seen, self._seen = self._seen, stats.frames
        if _passed(seen, stats.frames, self.every):
            stats.telemetry = self.watch.update(self._clock() - self._t0, float(stats.fps))


def _passed(before: int, after: int, every: int) -> bool:
    """Whether a count in (``before``, ``after``] is one that ``count % every == 1`` picks: the per-frame rule
    of these observers, for a batch of frames at once."""
    return every > 1 and after > before and (after - 1) // every != (before - 1) // every


def _sources(info: JSONDict) -> int:
    """Sources of the run (``on_start``'s info): the refresh intervals above are per source's frames, so 16
    cameras at 2 600 frames/s read the board 5 times a second, not 87 (each reading holds the interpreter lock
    on the results thread, beside the slot threads that feed the engine)."""
    names = info.get("sources")
    return max(1, len(names)) if isinstance(names, (list, tuple)) else 1


def open_telemetry() -> TelemetryObserver | None:
    """An observer when this machine shows any telemetry (a Jetson's sysfs, an NVIDIA GPU), else None."""
    from edgert.power.telemetry import TelemetryWatch, read_telemetry

    first = read_telemetry()
    if not any(k != "throttle" for k in first):
        return None
    return TelemetryObserver(TelemetryWatch())


class RunHooks:
    """The power, systemd and metrics wiring of one run; ``close()`` releases all of it.

    Everything that can fail to start (no meter for a budget, a metrics port in use) fails here, in the
    constructor, before the pipeline opens any sink.
    """

    def __init__(self, config: PipelineConfig, name: str, environment: bool = True) -> None:
        self.admit: Callable[[], None] | None = None
        self.observers: list[PipelineObserver] = []
        self.metrics_url: str | None = None
        self._controller: BudgetController | None = None
        self._sampler: PowerSampler | None = None
        self._telemetry: TelemetryObserver | None = None
        self._closers: list[Callable[[], None]] = []
        try:
            self._open_power(config)
            self._telemetry = open_telemetry()
            if self._telemetry is not None:
                self.observers.append(self._telemetry)
            if config.runtime.metrics:
                self._open_metrics(config.runtime.metrics, name)
            if environment:
                from edgert.service.watchdog import SystemdObserver

                systemd = SystemdObserver.from_env()
                if systemd is not None:
                    self.observers.append(systemd)
        except BaseException:
            self.close()
            raise

    @property
    def controller(self) -> BudgetController | None:
        """The budget controller of a run with ``power.budget_w`` (None without): the speech processor sheds
        Whisper work by it instead of pacing admission."""
        return self._controller

    def _open_power(self, config: PipelineConfig) -> None:
        if config.power.budget_w is not None:
            from edgert.power.budget import budget_admission

            controller = budget_admission(config.power)  # a controller: the config sets a budget
            if controller is not None:
                self._controller = controller
                self._closers.append(controller.close)
                self.admit = controller.admit
                self.observers.append(PowerWatts(controller.sampler, config.power.rail, count_frames=False))
                return
        # Started by begin(), when frames start: energy per frame should not carry the model's loading.
        self._sampler = open_power_sampler(config, start=False)
        if self._sampler is not None:
            self._closers.append(self._sampler.stop)
            self.observers.append(PowerWatts(self._sampler, config.power.rail, count_frames=True))

    def _open_metrics(self, listen: str, name: str) -> None:
        from edgert.service.metrics import MetricsObserver, MetricsServer, parse_listen

        host, port = parse_listen(listen)
        observer = MetricsObserver(pipeline=name)
        server = MetricsServer(host, port, observer.render)
        self._closers.append(server.close)
        self.observers.append(observer)
        self.metrics_url = server.url

    def begin(self) -> None:
        """Frames are about to flow: the energy interval opens (a budget controller starts at its first admit)."""
        if self._sampler is not None:
            self._sampler.start()

    def end(self) -> None:
        """The last frame is through: the energy interval closes."""
        if self._sampler is not None:
            self._sampler.stop()

    def telemetry_summary(self) -> JSONDict | None:
        """Peaks, throttling and its episodes over the run; None where the machine shows no telemetry."""
        return None if self._telemetry is None else self._telemetry.watch.summary()

    def power_summary(self) -> JSONDict | None:
        if self._controller is not None:
            out = dict(self._controller.stats())
            if self._telemetry is not None:
                # The controller's own pacing is in its stats; these are the cuts the board made itself.
                out["board_throttle_episodes"] = self._telemetry.watch.summary()["throttle_episodes"]
            return out
        if self._sampler is not None:
            self._sampler.stop()  # the summary covers the run, not the time after it
            return dict(self._sampler.summary())
        return None

    def close(self) -> None:
        closers, self._closers = self._closers, []
        for close in reversed(closers):
            try:
                close()
            except Exception:  # closing one part must not keep the others open
                log.warning("closing %r failed", close, exc_info=True)
