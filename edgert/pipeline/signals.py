"""SIGINT and SIGTERM during a run: the first stops it gracefully, a second one aborts it. SIGHUP reopens the file
sinks (a log rotation) and never stops the run.

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgert.pipeline.state import RunState

__all__ = ["install_signals"]

log = logging.getLogger(__name__)

_REPEAT_S = 0.5  # a copy of the same signal within this (e.g. sent to the process group) is not a second request


def install_signals(run: RunState, enabled: bool = True) -> Callable[[], None]:
    """Handle SIGINT and SIGTERM for ``run`` (when ``enabled``, the pipeline's ``handle_signals``, and on the main
    thread): the first is the pipeline's ``request_stop``, a second its ``abort``, which leaves at once when no
    output was opened yet. Return what puts the previous handlers back."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        return lambda: None

    first_at: list[float] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if not first_at:
            first_at.append(now)
            log.warning("%s: finishing the frames in flight, then stopping", name)
            run.request_stop(name)
        elif now - first_at[0] > _REPEAT_S:
            log.warning("%s again: stopping now", name)
            run.abort(name)
            if not run.outputs_open:  # nothing written yet (a model still loading, an engine building):
                raise KeyboardInterrupt  # leave at once

    def reopen(signum: int, frame: FrameType | None) -> None:
        from edgert.io.sinks.reopen import request_reopen

        log.warning("SIGHUP: file sinks open their paths again (a log rotation)")
        request_reopen()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    if hasattr(signal, "SIGHUP"):  # logrotate's postrotate: reopen, never stop
        old[signal.SIGHUP] = signal.signal(signal.SIGHUP, reopen)

    def restore() -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    return restore
