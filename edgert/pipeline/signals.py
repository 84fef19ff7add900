"""SIGINT and SIGTERM during a run: the first stops it gracefully, a second one aborts it.

Apart from :mod:`edgert.pipeline.runner` because it is process-wide state (signal handlers belong to the main
thread and must be put back exactly as they were) rather than part of moving frames; the pipeline only asks for
the handlers at the start of a run and restores them after the last sink has closed.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

#: The runner's Pipeline, typed loosely here: importing it (even for types) would make runner <-> this module a circle.
Pipeline = Any
__all__ = ["install_signals"]

log = logging.getLogger("edgert.pipeline.runner")  # the run's one logger, as before the split

_REPEAT_S = 0.5  # a copy of the same signal within this (e.g. sent to the process group) is not a second request


def install_signals(p: Pipeline) -> Callable[[], None]:
    """Handle SIGINT and SIGTERM for ``p``'s run (when it handles signals and runs on the main thread): the first
    is :meth:`~Pipeline.request_stop`, a second :meth:`~Pipeline.abort`, which leaves at once when no output was
    opened yet. Return what puts the previous handlers back."""
    if not p.handle_signals or threading.current_thread() is not threading.main_thread():
        return lambda: None

    first_at: list[float] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if not first_at:
            first_at.append(now)
            log.warning("%s: finishing the frames in flight, then stopping", name)
            p.request_stop(name)
        elif now - first_at[0] > _REPEAT_S:
            log.warning("%s again: stopping now", name)
            p.abort(name)
            if not p._outputs_open:  # nothing written yet (a model still loading, an engine building):
                raise KeyboardInterrupt  # leave at once

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    return restore
