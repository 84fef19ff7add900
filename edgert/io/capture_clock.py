"""The clock of live sources' media time: monotonic, on the wall clock's scale.

Analytics (zone dwell, track ages, line-crossing times) run on a frame's media time; for a live source that is
when the frame arrived. Read from the wall clock, a step of it (NTP setting the time at boot on a Jetson without
an RTC, an operator's ``date -s``) made a zone's dwell 21 660 s instead of 58 after +1 h, and times run backwards
after -1 h. :func:`capture_clock` is ``time.monotonic()`` shifted once, at the first import, onto the wall
clock's scale (so its values still read as dates), and never stepped after. The shift is passed to spawned capture
workers through the environment, so a camera read in a worker and one read in the main process share one clock.
The timestamps written out (``timestamp`` of a JSONL record) stay wall-clock time, which is what a reader of them
wants after a correction.
"""

from __future__ import annotations

import contextlib
import os
import time

__all__ = ["ENV_OFFSET", "capture_clock"]

ENV_OFFSET = "EDGERT_CAPTURE_CLOCK_OFFSET"


def _offset() -> float:
    text = os.environ.get(ENV_OFFSET, "")
    with contextlib.suppress(ValueError):  # unset (or not a number): this process is the first, it sets it
        return float(text)
    offset = time.time() - time.monotonic()
    os.environ[ENV_OFFSET] = repr(offset)  # inherited by the capture workers this process spawns
    return offset


_OFFSET = _offset()


def capture_clock() -> float:
    """Seconds on the wall clock's scale that only ever move forward at the rate of real time."""
    return time.monotonic() + _OFFSET
