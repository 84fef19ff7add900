"""Bounds on a run: the memory its frames in flight hold, and how long a graceful stop may take.

Memory: every source gets ``max(runtime.queue_size, 2 x slots x share)`` frame buffers, so the pixels held
grow with sources x queue x frame size (64 sources x 64 frames of 1080p is 25 GB). The run refuses to start
when that total is over a limit (half this machine's memory, or ``EDGERT_FRAME_MEMORY_MB``), in one line
that says which figure to lower, instead of swapping or being killed by the OOM killer.

Stopping: SIGTERM lets the frames in flight finish and the sinks drain. With many sources, long queues or
a slow sink that takes longer than systemd waits (``TimeoutStopSec``), and its SIGKILL loses the videos'
indexes. So a graceful stop has a deadline (``EDGERT_STOP_DEADLINE_S``, 10 s by default; the unit sets it
well under its ``TimeoutStopSec``): past it, the frames still in flight and the frames queued for sinks are
dropped and counted (``stop_deadline`` in the drops), network sinks stop waiting for acknowledgements, and
the file sinks are closed, so every file is finalised in time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from edgert.errors import ConfigError

if TYPE_CHECKING:
    from edgert.io.sinks import SinkWorker
    from edgert.pipeline.feeds import _Feed

__all__ = [
    "ENV_FRAME_MEMORY_MB", "ENV_STOP_DEADLINE_S", "StopDeadline", "check_frame_memory", "drop_for_deadline",
    "stop_deadline_s",
]

log = logging.getLogger(__name__)

ENV_FRAME_MEMORY_MB = "EDGERT_FRAME_MEMORY_MB"
ENV_STOP_DEADLINE_S = "EDGERT_STOP_DEADLINE_S"
DEFAULT_STOP_DEADLINE_S = 10.0


def _env_number(name: str, default: float, low: float) -> float:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= low:  # also refuses NaN
        raise ConfigError(f"{name}={text!r}: expected a number of at least {low:g}")
    return value


def _machine_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not every platform names these
        return None


def check_frame_memory(sizes: Sequence[tuple[str, int, int]], frames_per_source: int) -> int:
    """Bytes the frame buffers of ``sizes`` (name, width, height per open source) hold; a :class:`ConfigError`
    when that is over the limit. A source that does not know its size yet counts as nothing."""
    per_source = [(name, w * h * 3 * frames_per_source) for name, w, h in sizes]
    total = sum(b for _, b in per_source)
    machine = _machine_memory_bytes()
    default_mb = machine / 2 / 2**20 if machine else 8192.0
    limit_mb = _env_number(ENV_FRAME_MEMORY_MB, default_mb, 1)
    if total > limit_mb * 2**20:
        biggest = max(per_source, key=lambda nb: nb[1])[0]
        raise ConfigError(
            f"the frames in flight would hold {total / 2**20:.1f} MB ({len(sizes)} sources x {frames_per_source} "
            f"frames; the largest, {biggest}, alone {max(b for _, b in per_source) / 2**20:.1f} MB), over the "
            f"limit of {limit_mb:.0f} MB. Note: lower runtime.queue_size or the number of sources, or raise "
            f"{ENV_FRAME_MEMORY_MB}")
    return total


def stop_deadline_s() -> float:
    """Seconds a graceful stop may take (``EDGERT_STOP_DEADLINE_S``, default 10)."""
    return _env_number(ENV_STOP_DEADLINE_S, DEFAULT_STOP_DEADLINE_S, 0.1)


class StopDeadline:
    """Started at a stop request; when ``seconds`` pass before :meth:`cancel`, ``overdue()`` runs once."""

    def __init__(self, seconds: float, overdue: Callable[[], None]) -> None:
        self.seconds = seconds
        self.fired = False
        self._overdue = overdue
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.name = "edgert-stop-deadline"
            self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        try:
            self._overdue()
        except Exception:  # the stop must go on whatever went wrong here
            log.warning("the stop deadline's handler failed", exc_info=True)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def drop_for_deadline(feeds: Sequence[_Feed], workers: Sequence[SinkWorker], seconds: float) -> int:
    """Count the frames still in flight, empty the sinks' queues (counted as their drops); the total."""
    in_flight: int = sum(max(0, len(feed.frames) - feed.free.qsize()) for feed in feeds)
    queued = sum(worker.drop_queued() for worker in workers if hasattr(worker, "drop_queued"))
    log.warning("the stop took longer than %g s (%s): dropping %d frames in flight and %d queued for sinks, "
                "then closing the files", seconds, ENV_STOP_DEADLINE_S, in_flight, queued)
    return in_flight
