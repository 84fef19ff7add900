"""Power: measure watts per rail and energy per frame, and run a pipeline under a power budget.

* :func:`open_meter` -- Jetson INA3221/INA238 sysfs (``"ina"``), ``"tegrastats"``, ``"nvml"`` (NVIDIA
  GPUs), ``"rapl"`` (x86 CPU package), or ``"auto"``: the first that works, else a null meter that
  says why nothing can be measured.
* :class:`PowerSampler` -- a thread reading a meter at a fixed rate: average and peak watts per rail,
  joules, and millijoules per frame of a pipeline that counts its frames.
* :class:`BudgetController` / :func:`budget_admission` -- paces frame admission so the moving-average
  power stays at or under a budget (control law in :mod:`edgert.power.budget`).
* :mod:`edgert.power.nvpmodel` -- the Jetson power mode (read-only unless asked).
"""

from __future__ import annotations

import re

from edgert.errors import ConfigError
from edgert.power.budget import BudgetController, budget_admission
from edgert.power.clock import Clock, ScaledClock
from edgert.power.meter import PowerMeter, PowerReading
from edgert.power.meters import METERS, MeterKind, meter_kinds, open_meter, register_meter
from edgert.power.null import NullMeter
from edgert.power.sampler import PowerSampler, Sample
from edgert.power.simulated import SimulatedBoard

__all__ = [
    "METERS",
    "BudgetController",
    "Clock",
    "MeterKind",
    "NullMeter",
    "PowerMeter",
    "PowerReading",
    "PowerSampler",
    "Sample",
    "ScaledClock",
    "SimulatedBoard",
    "budget_admission",
    "meter_kinds",
    "open_meter",
    "parse_watts",
    "register_meter",
]

_WATTS = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(mw|w|kw)?\s*$", re.IGNORECASE)
_SCALE = {None: 1.0, "mw": 1e-3, "w": 1.0, "kw": 1e3}


def parse_watts(text: str | float | int) -> float:
    """``"10W"`` -> 10.0; also ``"7.5"``, ``"500mW"``, ``"0.3kW"``. Raises ConfigError on anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _WATTS.match(str(text))
        if not m:
            raise ConfigError(f"power budget: expected watts like 10W, 7.5W or 500mW, got {text!r}")
        unit = m.group(2).lower() if m.group(2) else None
        value = float(m.group(1)) * _SCALE[unit]
    if not value > 0:
        raise ConfigError(f"power budget: expected watts > 0, got {text!r}")
    return value
