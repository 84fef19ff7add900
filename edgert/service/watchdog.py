"""Tell systemd how the pipeline is doing, from the pipeline's own progress.

:class:`SystemdObserver` is a pipeline observer. It sends ``READY=1`` when the pipeline reports its
start (model loaded, first frame through), ``WATCHDOG=1`` from ``on_frame`` — at most once per half
watchdog period — and ``STOPPING=1`` when the pipeline stops. There is deliberately no timer thread: a
pipeline whose source stalls or whose inference hangs calls no ``on_frame``, sends no ping, and systemd
kills and restarts it after ``WatchdogSec``. ``STATUS=`` lines carry FPS, watts, frames and drops, so
``systemctl status`` shows them.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from edgert.service.notify import Notifier, watchdog_interval

__all__ = ["STATUS_EVERY_S", "SystemdObserver", "status_line"]

log = logging.getLogger(__name__)

#: Without a watchdog, how often STATUS= is refreshed (seconds).
STATUS_EVERY_S = 5.0


def status_line(stats: Any) -> str:
    """``12.3 fps, 4.1 W, 1200 frames, 3 dropped`` from a PipelineStats (any object with those fields)."""
    fps = float(getattr(stats, "fps", 0.0) or 0.0)
    watts = getattr(stats, "watts", None)
    power = f"{float(watts):.1f} W" if watts is not None else "power n/a"
    frames = int(getattr(stats, "frames", 0) or 0)
    dropped = int(getattr(stats, "dropped", 0) or 0)
    return f"{fps:.1f} fps, {power}, {frames} frames, {dropped} dropped"


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


class SystemdObserver:
    """READY / WATCHDOG / STATUS / STOPPING for one pipeline run.

    ``watchdog_s`` is systemd's watchdog period (``WATCHDOG_USEC``); pings go out at most every
    ``watchdog_s / 2`` seconds, the interval sd_watchdog_enabled(3) recommends.
    """

    def __init__(self, notifier: Notifier, watchdog_s: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.notifier = notifier
        self.watchdog_s = watchdog_s
        self.ping_every = watchdog_s / 2.0 if watchdog_s else None
        self.status_every = min(STATUS_EVERY_S, self.ping_every) if self.ping_every else STATUS_EVERY_S
        self._clock = clock
        self._last_ping = -math.inf
        self._last_status = -math.inf
        self._ready = False
        self._stopping = False
        self.pings = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SystemdObserver | None:
        """An observer when ``NOTIFY_SOCKET`` is set (the process runs as a notify service), else None."""
        notifier = Notifier.from_env(env)
        if notifier is None:
            return None
        interval = watchdog_interval(env)
        log.info("systemd notify socket %s, watchdog %s", notifier.address,
                 f"{interval:g} s" if interval else "off")
        return cls(notifier, interval)

    def on_start(self, info: Any) -> None:
        model, backend = _field(info, "model"), _field(info, "backend")
        what = f"running {os.path.basename(str(model))} on {backend}" if model and backend else "running"
        # The first WATCHDOG=1 rides with READY=1: the watchdog period starts when the unit is up.
        now = self._clock()
        self.notifier.send("READY=1", "WATCHDOG=1", f"STATUS={what}: first frame through")
        self._ready = True
        self._last_ping = self._last_status = now

    def on_frame(self, stats: Any) -> None:
        if not self._ready or self._stopping:
            return
        now = self._clock()
        if self.ping_every is not None and now - self._last_ping >= self.ping_every:
            self.notifier.watchdog(status=status_line(stats))
            self._last_ping = self._last_status = now
            self.pings += 1
        elif now - self._last_status >= self.status_every:
            self.notifier.status(status_line(stats))
            self._last_status = now

    on_frames = on_frame  # by the clock, not the count: a batch at once is the same (edgert.pipeline.observer)

    def on_progress(self, stats: Any) -> None:
        """Work inside one frame moved on (a decoder step of a long Whisper window): the same pings as a frame,
        so a 30 s window on a slow board does not look like a hang. A hung decoder calls this no more."""
        self.on_frame(stats)

    def on_stop_requested(self, reason: str = "") -> None:
        """Say STOPPING=1 as soon as a stop is asked for (SIGTERM), before sinks are flushed.

        A pipeline that tells observers about stop requests calls this; otherwise :meth:`on_stop` sends
        STOPPING=1 after the sinks are flushed, just before the process exits.
        """
        if not self._stopping:
            self._stopping = True
            why = f" ({reason})" if reason else ""
            self.notifier.stopping(status=f"stopping{why}: flushing sinks")

    def on_stop(self, summary: Any) -> None:
        frames = _field(summary, "frames")
        self.on_stop_requested()
        if frames is not None:
            self.notifier.status(f"stopped after {frames} frames")

    def close(self) -> None:
        self.notifier.close()
