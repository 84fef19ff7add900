"""The meter of a machine where nothing can be measured: it says why."""

from __future__ import annotations

from edgert.errors import PowerError
from edgert.power.clock import Clock
from edgert.power.meter import PowerMeter, PowerReading

__all__ = ["NullMeter"]


class NullMeter(PowerMeter):
    """No rails; ``reason`` says what was looked for and not found. ``read()`` raises PowerError."""

    kind = "null"

    def __init__(self, reason: str, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.reason = reason

    @property
    def available(self) -> bool:
        return False

    @property
    def rails(self) -> tuple[str, ...]:
        return ()

    @property
    def description(self) -> str:
        return f"no power meter: {self.reason}"

    def read(self) -> PowerReading:
        raise PowerError(f"no power meter on this machine: {self.reason}")
