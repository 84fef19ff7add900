"""Jetson on-module power monitors (TI INA3221, and the INA238 of Jetson Thor) read through sysfs.

Three layouts exist in the field; all are found under ``edgert.platform.sysroot()`` so tests can point
the meter at a fixture tree:

* mainline ``ina3221`` hwmon driver (Orin and Thor on JetPack 6/7, Xavier on JetPack 5):
  ``/sys/bus/i2c/drivers/ina3221/<bus>-<addr>/hwmon/hwmon<N>/`` with ``in<c>_label`` (rail name),
  ``in<c>_input`` (bus voltage, mV) and ``curr<c>_input`` (current, mA) for channels 1-3. Channels
  labelled ``NC`` are not connected (AGX Orin); ``in7`` is the driver's "sum of shunt voltages" and has
  no current of its own; a channel whose ``in<c>_enable`` is 0 is off.
* mainline ``ina238`` hwmon driver (Thor's input monitor): ``in1_input`` (bus mV), ``curr1_input`` (mA),
  ``power1_input`` (uW) and, on the INA228/INA780 variants, ``energy1_input`` (uJ).
* NVIDIA's ``ina3221x`` IIO driver (JetPack 4 and older):
  ``/sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:device<N>/`` with ``rail_name_<c>``,
  ``in_power<c>_input`` (mW), ``in_voltage<c>_input`` (mV) and ``in_current<c>_input`` (mA), c = 0-2.

Sources: the kernel's Documentation/hwmon/ina3221.rst and ina238.rst, NVIDIA's Jetson Linux Developer
Guide (Platform Power and Performance), and jetson-stats (jtop/core/power.py), which reads the same
files. Which rails add up to the board is decided by :func:`total_rails_for`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from edgert.errors import PowerError
from edgert.platform import sysroot
from edgert.power.clock import Clock
from edgert.power.meter import PowerMeter, PowerReading

__all__ = ["InaChannel", "JetsonInaMeter", "discover_channels", "total_rails_for"]

log = logging.getLogger(__name__)

_INA3221_HWMON = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"
_INA238_HWMON = "sys/bus/i2c/drivers/ina238/*/hwmon/hwmon*"
_INA3221X_IIO = "sys/bus/i2c/drivers/ina3221x/*/iio:device*"

#: rails that measure the whole module input, in order of preference (names differ by board/JetPack)
_INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "5V_IN", "VIN")
#: AGX Orin: NVIDIA's guide says VDDQ_VDD2_1V8AO is already included in VIN_SYS_5V0
_INCLUDED_IN_OTHERS = {"VIN_SYS_5V0": ("VDDQ_VDD2_1V8AO",)}


@dataclass(frozen=True)
class InaChannel:
    """One monitored rail and the files that give its readings."""

    rail: str
    source: str  # e.g. "ina3221 1-0040 channel 1", for messages
    volts_file: Path | None = None  # mV
    amps_file: Path | None = None  # mA
    power_file: Path | None = None
    power_to_watts: float = 1e-3  # ina3221x gives mW, ina238 gives uW
    energy_file: Path | None = None  # uJ, cumulative


def total_rails_for(rails: tuple[str, ...]) -> tuple[str, ...]:
    """Which rails sum to the module's power: its input rail when it has one, else the parts.

    Orin Nano/NX and Xavier NX: ``VDD_IN``; Nano: ``POM_5V_IN``; AGX Orin has no input rail, and its
    ``VDDQ_VDD2_1V8AO`` is inside ``VIN_SYS_5V0``; AGX Xavier has none either, and its six rails are
    summed (as NVIDIA's forum and energymon do).
    """
    for name in _INPUT_RAILS:
        if name in rails:
            return (name,)
    skip = {inner for outer, inners in _INCLUDED_IN_OTHERS.items() if outer in rails for inner in inners}
    return tuple(r for r in rails if r not in skip)


def _text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip("\x00\n ")
    except OSError:
        return None


def _device(hwmon_or_iio: Path) -> str:
    """The I2C device name (``1-0040``) of a hwmon or iio folder."""
    parent = hwmon_or_iio.parent
    return parent.parent.name if parent.name == "hwmon" else parent.name


def _ina3221_hwmon(folder: Path) -> list[InaChannel]:
    out = []
    dev = _device(folder)
    for label_file in sorted(folder.glob("in*_label")):
        num = label_file.name[2:-len("_label")]
        label = _text(label_file)
        if not num.isdigit() or not label:
            continue
        if label.upper() == "NC":
            log.debug("%s: channel %s not connected", dev, num)
            continue
        curr = folder / f"curr{num}_input"
        volt = folder / f"in{num}_input"
        if not curr.exists() or not volt.exists():  # in7: the driver's sum of shunt voltages
            continue
        if _text(folder / f"in{num}_enable") == "0":
            log.debug("%s: channel %s (%s) disabled", dev, num, label)
            continue
        out.append(InaChannel(label, f"ina3221 {dev} channel {num}", volts_file=volt, amps_file=curr))
    return out


def _ina238_hwmon(folder: Path, only_one: bool) -> list[InaChannel]:
    dev = _device(folder)
    # The INA238 on Thor measures the module input (VIN); its driver gives no label unless the
    # device tree names one.
    label = _text(folder / "in1_label") or _text(folder / "label") or ("VIN" if only_one else f"VIN@{dev}")
    power = folder / "power1_input"
    energy = folder / "energy1_input"
    volt, curr = folder / "in1_input", folder / "curr1_input"
    if not power.exists() and not (volt.exists() and curr.exists()):
        return []
    return [InaChannel(
        label, f"ina238 {dev}",
        volts_file=volt if volt.exists() else None,
        amps_file=curr if curr.exists() else None,
        power_file=power if power.exists() else None, power_to_watts=1e-6,
        energy_file=energy if energy.exists() else None,
    )]


def _ina3221x_iio(folder: Path) -> list[InaChannel]:
    out = []
    dev = _device(folder)
    for name_file in sorted(folder.glob("rail_name_*")):
        num = name_file.name[len("rail_name_"):]
        label = _text(name_file)
        if not num.isdigit() or not label:
            continue
        power = folder / f"in_power{num}_input"
        volt, curr = folder / f"in_voltage{num}_input", folder / f"in_current{num}_input"
        if not power.exists() and not (volt.exists() and curr.exists()):
            continue
        out.append(InaChannel(
            label, f"ina3221x {dev} channel {num}",
            volts_file=volt if volt.exists() else None,
            amps_file=curr if curr.exists() else None,
            power_file=power if power.exists() else None, power_to_watts=1e-3,
        ))
    return out


def discover_channels(root: Path | None = None) -> list[InaChannel]:
    """Every connected rail of every INA monitor under ``root`` (default: the sysroot)."""
    root = root or sysroot()
    channels: list[InaChannel] = []
    for folder in sorted(root.glob(_INA3221_HWMON)):
        channels += _ina3221_hwmon(folder)
    ina238 = sorted(root.glob(_INA238_HWMON))
    for folder in ina238:
        channels += _ina238_hwmon(folder, only_one=len(ina238) == 1)
    for folder in sorted(root.glob(_INA3221X_IIO)):
        channels += _ina3221x_iio(folder)
    # Two monitors may use one label; keep both, told apart by device.
    seen: dict[str, int] = {}
    for ch in channels:
        seen[ch.rail] = seen.get(ch.rail, 0) + 1
    out = []
    for ch in channels:
        if seen[ch.rail] > 1:
            ch = InaChannel(f"{ch.rail}@{ch.source.split()[1]}", ch.source, ch.volts_file, ch.amps_file,
                            ch.power_file, ch.power_to_watts, ch.energy_file)
        out.append(ch)
    return out


def _number(path: Path) -> float:
    text = path.read_text(errors="replace").strip("\x00\n ")
    # Some L4T limits read "32760 ma": the number is the first word.
    return float(text.split()[0])


class JetsonInaMeter(PowerMeter):
    """Reads the INA3221/INA238 rails found by :func:`discover_channels`."""

    kind = "ina"

    def __init__(self, channels: list[InaChannel] | None = None, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.channels = channels if channels is not None else discover_channels()
        if not self.channels:
            raise PowerError(
                "no Jetson INA3221/INA238 power monitor found under "
                f"{sysroot() / 'sys/bus/i2c/drivers'} (ina3221, ina238, ina3221x)"
            )
        self._rails = tuple(ch.rail for ch in self.channels)
        self._total_rails = total_rails_for(self._rails)
        self._energy0: dict[str, float] = {}
        self.read()  # unreadable files (permissions, a driver in a bad state) fail here, not mid-run

    @property
    def description(self) -> str:
        devices = sorted({" ".join(ch.source.split()[:2]) for ch in self.channels})
        return f"Jetson INA power monitor ({', '.join(devices)}): {', '.join(self.rails)}"

    def read(self) -> PowerReading:
        watts: dict[str, float] = {}
        volts: dict[str, float] = {}
        amps: dict[str, float] = {}
        energy: dict[str, float] = {}
        now = self.clock.now()
        for ch in self.channels:
            try:
                if ch.volts_file is not None:
                    volts[ch.rail] = _number(ch.volts_file) / 1000.0
                if ch.amps_file is not None:
                    amps[ch.rail] = _number(ch.amps_file) / 1000.0
                if ch.power_file is not None:
                    watts[ch.rail] = _number(ch.power_file) * ch.power_to_watts
                else:
                    watts[ch.rail] = volts[ch.rail] * amps[ch.rail]
                if ch.energy_file is not None:
                    raw = _number(ch.energy_file) / 1e6
                    first = self._energy0.setdefault(ch.rail, raw)
                    energy[ch.rail] = raw - first
            except (OSError, ValueError, IndexError) as exc:
                raise PowerError(f"cannot read {ch.rail} ({ch.source}): {exc}") from exc
        return PowerReading(now, watts, self._sum_total(watts), volts, amps, energy)
