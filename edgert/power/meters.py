"""Pick a power meter: by name, or the best one this machine has."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

from edgert.errors import EdgertError, PowerError
from edgert.power.clock import Clock
from edgert.power.meter import PowerMeter
from edgert.power.null import NullMeter

__all__ = ["METERS", "MeterKind", "meter_kinds", "open_meter", "register_meter"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeterKind:
    """One kind of power meter: its name (``power.meter``, ``--meter``) and the :class:`PowerMeter` subclass
    that measures it, as ``"module:Class"`` (imported only when opened; the class takes ``clock=``)."""

    name: str
    target: str
    #: ``auto`` tries it only where a GPU device node exists (NVML on a machine without one only fails slowly).
    auto_needs_gpu: bool = False

    def open(self, clock: Clock | None, auto: bool = False) -> PowerMeter:
        if auto and self.auto_needs_gpu:
            # under the sysroot, so a fake root has no GPU
            from edgert.platform import gpu_present

            present, why = gpu_present()
            if not present:
                raise PowerError(why)
        module_name, cls_name = self.target.split(":")
        meter: PowerMeter = getattr(importlib.import_module(module_name), cls_name)(clock=clock)
        return meter


#: Every power meter, the one table that ``open_meter``, ``edgert power --meter`` and the errors read, in the
#: order "auto" tries them. To add a meter: a module with a :class:`PowerMeter` subclass, and one line here.
METERS: list[MeterKind] = [
    MeterKind("ina", "edgert.power.jetson_ina:JetsonInaMeter"),
    MeterKind("tegrastats", "edgert.power.tegrastats:TegrastatsMeter"),
    MeterKind("nvml", "edgert.power.nvml:NvmlMeter", auto_needs_gpu=True),
    MeterKind("rapl", "edgert.power.rapl:RaplMeter"),
]


def meter_kinds() -> tuple[str, ...]:
    """Every registered meter name, in the order "auto" tries them (those added by :func:`register_meter` too)."""
    return tuple(kind.name for kind in METERS)


def register_meter(kind: MeterKind) -> None:
    """Add a meter kind (a plugin, a test); "auto" tries it after the built-in ones."""
    if kind.name in meter_kinds() or kind.name == "auto":
        raise ValueError(f"a power meter named {kind.name!r} is registered already")
    METERS.append(kind)


def open_meter(kind: str = "auto", clock: Clock | None = None) -> PowerMeter:
    """Open the meter ``kind`` ("ina", "tegrastats", "nvml", "rapl") or, for "auto", the first that works.

    A named meter that cannot measure here raises :class:`PowerError` saying why. "auto" never raises:
    when nothing works it returns a :class:`NullMeter` whose reason lists what was tried.
    """
    if kind != "auto":
        named = {row.name: row for row in METERS}.get(kind)
        if named is None:
            valid = ", ".join(("auto", *meter_kinds()))
            raise PowerError(f"unknown power meter {kind!r}. Note: choose one of {valid}")
        return named.open(clock)
    reasons = []
    for row in list(METERS):
        try:
            meter = row.open(clock, auto=True)
        except EdgertError as exc:
            log.debug("meter %s: %s", row.name, exc)
            reasons.append(f"{row.name}: {exc}")
            continue
        log.info("power meter: %s", meter.description)
        return meter
    return NullMeter("; ".join(reasons), clock=clock)
