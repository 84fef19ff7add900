"""Time for the power code: the real clock, and a faster-than-real one for simulations.

Every sleep and timestamp in the sampler, the budget controller and the simulated board goes through a
:class:`Clock`, so a test can run a 30-second control experiment in a couple of real seconds by giving
all of them the same :class:`ScaledClock`. The threads still run for real; only the time unit changes.
"""

from __future__ import annotations

import threading
import time

__all__ = ["Clock", "ScaledClock", "VirtualClock"]


class Clock:
    """Wall-clock time: ``time.monotonic`` and ``time.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait for ``event`` at most ``seconds`` (clock seconds); True when it was set."""
        return event.wait(max(seconds, 0.0))

    def register(self, thread: threading.Thread | None = None) -> None:
        """Say that ``thread`` (default: the caller) keeps time with this clock. Real clocks ignore it."""


class ScaledClock(Clock):
    """A clock that runs ``speed`` times faster than the wall: one real second is ``speed`` clock seconds."""

    def __init__(self, speed: float) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.speed = float(speed)
        self._origin = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._origin) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(seconds, 0.0) / self.speed)


class VirtualClock(Clock):
    """Discrete-event time shared by threads: it stands still while any participant thread is running
    and jumps to the earliest wake-up once every participant is asleep on it.

    Participants are the threads passed to :meth:`register` and any thread that sleeps or waits on the
    clock; a thread stops being one when it ends or calls :meth:`leave`. Register every thread that
    drives the simulation before any of them first sleeps (a thread that starts threads registers
    itself and them before starting them); until then time does not wait for it.

    A simulation of minutes then takes as long as its computation, whatever the machine's load.
    Should a participant block on something other than this clock (a join, a lock held elsewhere)
    while the others sleep, time moves on after ``stall_s`` real seconds (counted in ``stalls``), so a
    simulation cannot deadlock.
    """

    def __init__(self, start: float = 0.0, stall_s: float = 5.0) -> None:
        self._now = float(start)
        self._stall_s = stall_s
        self._cond = threading.Condition()
        self._participants: set[threading.Thread] = set()
        self._seen_alive: set[threading.Thread] = set()
        self._deadlines: dict[threading.Thread, float] = {}
        self._activity = time.monotonic()  # real time of the last sleep, wake-up or advance by anyone
        self.stalls = 0  # times time moved on because a participant was blocked elsewhere

    def now(self) -> float:
        return self._now

    def register(self, thread: threading.Thread | None = None) -> None:
        with self._cond:
            self._participants.add(thread or threading.current_thread())

    def leave(self) -> None:
        """The calling thread takes no further part: time no longer waits for it."""
        with self._cond:
            self._participants.discard(threading.current_thread())
            self._advance_if_idle()

    def sleep(self, seconds: float) -> None:
        self._block(self._now + max(seconds, 0.0), None)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return self._block(self._now + max(seconds, 0.0), event)

    def _block(self, deadline: float, event: threading.Event | None) -> bool:
        me = threading.current_thread()
        with self._cond:
            self._participants.add(me)
            self._seen_alive.add(me)
            self._deadlines[me] = deadline
            self._activity = time.monotonic()
            try:
                while True:
                    if event is not None and event.is_set():
                        return True
                    if self._now >= deadline:
                        return event.is_set() if event is not None else False
                    if self._advance_if_idle():
                        continue
                    if time.monotonic() - self._activity > self._stall_s:
                        # Nobody has slept, woken or advanced for stall_s: someone is blocked elsewhere.
                        self.stalls += 1
                        self._advance(min(self._deadlines.values()))
                        continue
                    # Events are set without telling the clock: poll them at a short real interval.
                    self._cond.wait(timeout=0.002 if event is not None else 0.02)
            finally:
                del self._deadlines[me]
                self._activity = time.monotonic()

    def _advance_if_idle(self) -> bool:
        # A thread that ended stops counting. One registered but not yet seen running counts as running
        # (is_alive() is briefly False while a thread starts).
        for t in list(self._participants):
            if t.is_alive():
                self._seen_alive.add(t)
            elif t in self._seen_alive:
                self._participants.discard(t)
                self._seen_alive.discard(t)
        if not self._deadlines or any(t not in self._deadlines for t in self._participants):
            return False
        return self._advance(min(self._deadlines.values()))

    def _advance(self, to: float) -> bool:
        if to <= self._now:
            return False
        self._now = to
        self._activity = time.monotonic()
        self._cond.notify_all()
        return True
