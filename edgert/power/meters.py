"""Pick a power meter: by name, or the best one this machine has."""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgert.errors import EdgertError, PowerError
from edgert.power.clock import Clock
from edgert.power.meter import PowerMeter
from edgert.power.null import NullMeter

__all__ = ["METER_KINDS", "open_meter"]

log = logging.getLogger(__name__)

#: names ``open_meter`` accepts, in the order "auto" tries them
METER_KINDS: tuple[str, ...] = ("ina", "tegrastats", "nvml", "rapl")


def _ina(clock: Clock | None) -> PowerMeter:
    from edgert.power.jetson_ina import JetsonInaMeter

    return JetsonInaMeter(clock=clock)


def _tegrastats(clock: Clock | None) -> PowerMeter:
    from edgert.power.tegrastats import TegrastatsMeter

    return TegrastatsMeter(clock=clock)


def _nvml(clock: Clock | None) -> PowerMeter:
    from edgert.power.nvml import NvmlMeter

    return NvmlMeter(clock=clock)


def _nvml_auto(clock: Clock | None) -> PowerMeter:
    # Only where a GPU device node exists (under the sysroot, so a fake root has no GPU).
    from edgert.platform import gpu_present

    present, why = gpu_present()
    if not present:
        raise PowerError(why)
    return _nvml(clock)


def _rapl(clock: Clock | None) -> PowerMeter:
    from edgert.power.rapl import RaplMeter

    return RaplMeter(clock=clock)


_OPENERS: dict[str, Callable[[Clock | None], PowerMeter]] = {
    "ina": _ina, "tegrastats": _tegrastats, "nvml": _nvml, "rapl": _rapl,
}


def open_meter(kind: str = "auto", clock: Clock | None = None) -> PowerMeter:
    """Open the meter ``kind`` ("ina", "tegrastats", "nvml", "rapl") or, for "auto", the first that works.

    A named meter that cannot measure here raises :class:`PowerError` saying why. "auto" never raises:
    when nothing works it returns a :class:`NullMeter` whose reason lists what was tried.
    """
    if kind != "auto":
        opener = _OPENERS.get(kind)
        if opener is None:
            valid = ", ".join(("auto", *METER_KINDS))
            raise PowerError(f"unknown power meter {kind!r}. Note: choose one of {valid}")
        return opener(clock)
    reasons = []
    for name in METER_KINDS:
        opener = _nvml_auto if name == "nvml" else _OPENERS[name]
        try:
            meter = opener(clock)
        except EdgertError as exc:
            log.debug("meter %s: %s", name, exc)
            reasons.append(f"{name}: {exc}")
            continue
        log.info("power meter: %s", meter.description)
        return meter
    return NullMeter("; ".join(reasons), clock=clock)
