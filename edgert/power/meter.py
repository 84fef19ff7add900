"""What every power meter is: a named set of rails, read on demand.

A meter reads instantaneous watts per rail (and, where the hardware keeps one, a cumulative energy
counter, which is more accurate than integrating samples). Which rails add up to the whole board
differs by board: on an Orin Nano ``VDD_IN`` is the module input and the other two rails are parts of
it; on an AGX Xavier there is no input rail and the six rails are summed. ``total_rails`` says which.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from edgert.power.clock import Clock

__all__ = ["PowerMeter", "PowerReading"]


@dataclass(frozen=True)
class PowerReading:
    """One reading of every rail of a meter.

    ``time`` is in the meter's clock seconds. ``watts`` has every rail; ``volts``/``amps`` only the rails
    whose monitor reports them; ``energy_j`` only rails with a hardware energy counter (joules since
    the meter was opened, wrap-around already undone). ``total_w`` is the whole-board figure.
    """

    time: float
    watts: Mapping[str, float]
    total_w: float
    volts: Mapping[str, float] = field(default_factory=dict)
    amps: Mapping[str, float] = field(default_factory=dict)
    energy_j: Mapping[str, float] = field(default_factory=dict)

    def rail(self, name: str | None) -> float:
        """Watts of ``name``; ``None`` or ``"total"`` is the whole-board figure."""
        if name is None or name == "total":
            return self.total_w
        return self.watts[name]


class PowerMeter(abc.ABC):
    """A source of power readings. Use as a context manager; ``close()`` stops any helper process."""

    #: short name shown to users and accepted by ``open_meter`` ("ina", "tegrastats", "nvml", ...)
    kind: str = "?"
    #: what a meter found when it opened: rail names, and those whose sum is the whole board (None: all)
    _rails: tuple[str, ...] = ()
    _total_rails: tuple[str, ...] | None = None

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()

    @property
    def available(self) -> bool:
        """False only for the null meter: nothing here can be measured."""
        return True

    @property
    def rails(self) -> tuple[str, ...]:
        """Rail names, in the order the hardware lists them."""
        return self._rails

    @property
    def total_rails(self) -> tuple[str, ...]:
        """The rails whose sum is the whole-board power (default: all of them)."""
        return self.rails if self._total_rails is None else self._total_rails

    @property
    def description(self) -> str:
        """One line saying what was found and where (or why nothing was)."""
        return f"{self.kind}: {', '.join(self.rails)}"

    @abc.abstractmethod
    def read(self) -> PowerReading:
        """Read every rail now. Raises :class:`~edgert.errors.PowerError` when the meter fails."""

    def has_rail(self, name: str | None) -> bool:
        return name is None or name == "total" or name in self.rails

    def check_rail(self, name: str | None) -> None:
        """Raise a one-line PowerError naming the valid rails when ``name`` is not one of them."""
        from edgert.errors import PowerError

        if not self.has_rail(name):
            valid = ", ".join(("total", *self.rails))
            raise PowerError(f"rail {name!r} not found on the {self.kind} meter. Note: rails are {valid}")

    def info(self) -> dict[str, Any]:
        """JSON-ready description, for ``edgert power --json`` and run summaries."""
        return {
            "meter": self.kind,
            "available": self.available,
            "description": self.description,
            "rails": list(self.rails),
            "total_rails": list(self.total_rails),
        }

    def _sum_total(self, watts: Mapping[str, float]) -> float:
        return float(sum(watts[r] for r in self.total_rails if r in watts))

    def close(self) -> None:  # noqa: B027 -- most meters hold nothing
        """Release what the meter holds. Safe to call twice."""

    def __enter__(self) -> PowerMeter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
