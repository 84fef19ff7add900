"""Intel (and recent AMD) CPU package energy through the powercap RAPL interface.

``/sys/class/powercap/intel-rapl:<p>/energy_uj`` counts microjoules and wraps at
``max_energy_range_uj``; sub-zones ``intel-rapl:<p>:<z>`` (core, uncore, dram) are parts of their
package. Watts are the counter's change over the time since the previous read. Since 2020 kernels make
``energy_uj`` readable by root only; the meter then refuses to open and says so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from edgert.errors import PowerError
from edgert.platform import sysroot
from edgert.power.clock import Clock
from edgert.power.meter import PowerMeter, PowerReading

__all__ = ["RaplMeter", "RaplZone", "discover_zones", "unwrap"]

_ZONES = "sys/class/powercap/intel-rapl:*"


@dataclass(frozen=True)
class RaplZone:
    rail: str  # "package-0", "package-0/dram"
    energy_file: Path
    max_range_uj: int
    top_level: bool


def unwrap(previous_uj: int, current_uj: int, max_range_uj: int) -> int:
    """Microjoules between two counter values, across at most one wrap-around."""
    if current_uj >= previous_uj:
        return current_uj - previous_uj
    return current_uj + (max_range_uj - previous_uj) + 1


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def discover_zones(root: Path | None = None) -> list[RaplZone]:
    root = root or sysroot()
    zones = []
    folders = sorted(root.glob(_ZONES))
    names = {f.name: (_text(f / "name") or f.name) for f in folders}
    for folder in folders:
        parts = folder.name.split(":")  # intel-rapl, p[, z]
        energy = folder / "energy_uj"
        if not energy.exists():
            continue
        max_range = _text(folder / "max_energy_range_uj")
        top = len(parts) == 2
        name = names[folder.name]
        rail = name if top else f"{names.get(':'.join(parts[:2]), parts[1])}/{name}"
        zones.append(RaplZone(rail, energy, int(max_range) if max_range and max_range.isdigit() else 2**32 - 1,
                              top))
    return zones


class RaplMeter(PowerMeter):
    """Package (and sub-zone) power from RAPL energy counters; total = the packages (plus psys, if alone)."""

    kind = "rapl"

    def __init__(self, zones: list[RaplZone] | None = None, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.zones = zones if zones is not None else discover_zones()
        if not self.zones:
            raise PowerError(f"no RAPL energy counters under {sysroot() / 'sys/class/powercap'}")
        self._lock = threading.Lock()
        self._prev: dict[str, int] = {}
        self._acc: dict[str, float] = {}
        self._last_watts: dict[str, float] = {}
        self._pending: dict[str, float] = {}  # joules since the last rate was computed
        self._prev_t = self.clock.now()
        for z in self.zones:
            try:
                self._prev[z.rail] = int(z.energy_file.read_text().strip())
            except PermissionError as exc:
                raise PowerError(
                    f"RAPL counters are readable by root only here ({z.energy_file}): run as root or "
                    "grant read access (chmod o+r)"
                ) from exc
            except (OSError, ValueError) as exc:
                raise PowerError(f"cannot read {z.energy_file}: {exc}") from exc
            self._acc[z.rail] = 0.0
            self._pending[z.rail] = 0.0
            self._last_watts[z.rail] = 0.0
        self._rails = tuple(z.rail for z in self.zones)
        packages = tuple(z.rail for z in self.zones if z.top_level and z.rail.startswith("package"))
        self._total_rails = packages or tuple(z.rail for z in self.zones if z.top_level) or self._rails

    @property
    def description(self) -> str:
        return f"Intel RAPL energy counters: {', '.join(self.rails)}"

    def read(self) -> PowerReading:
        with self._lock:
            now = self.clock.now()
            dt = now - self._prev_t
            for z in self.zones:
                try:
                    cur = int(z.energy_file.read_text().strip())
                except (OSError, ValueError) as exc:
                    raise PowerError(f"cannot read {z.energy_file}: {exc}") from exc
                joules = unwrap(self._prev[z.rail], cur, z.max_range_uj) / 1e6
                self._prev[z.rail] = cur
                self._acc[z.rail] += joules
                self._pending[z.rail] += joules
                if dt > 1e-4:  # two reads in the same instant: keep the last rate
                    self._last_watts[z.rail] = self._pending[z.rail] / dt
                    self._pending[z.rail] = 0.0
            if dt > 1e-4:
                self._prev_t = now
            watts = dict(self._last_watts)
            energy = dict(self._acc)
        return PowerReading(now, watts, self._sum_total(watts), energy_j=energy)
