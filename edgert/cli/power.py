"""``edgert power``: which power rails this machine has, what they read, the board's telemetry (temperatures,
clocks, loads, throttling, fan: edgert.power.telemetry) and the Jetson power mode."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def register(subparsers: Any) -> None:
    from edgert.power.meters import meter_kinds

    p = subparsers.add_parser("power", help="list power rails and their readings; Jetson power mode")
    p.add_argument("--meter", choices=("auto", *meter_kinds()), default="auto",
                   help="which meter to read (default: auto)")
    p.add_argument("--watch", action="store_true", help="keep printing readings until Ctrl-C")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between --watch readings (default 1)")
    p.add_argument("--count", type=int, default=None, help="with --watch: stop after this many readings")
    p.add_argument("--json", action="store_true", help="print JSON (one object per reading with --watch)")
    p.add_argument("--set-mode", type=int, default=None, metavar="N",
                   help="switch the Jetson power mode to N with nvpmodel (root only; edgert never does otherwise)")
    p.set_defaults(func=run)


def _reading_dict(reading: Any, meter: Any) -> dict[str, Any]:
    rails = {}
    for name, w in reading.watts.items():
        entry = {"watts": round(w, 4)}
        if name in reading.volts:
            entry["volts"] = round(reading.volts[name], 4)
        if name in reading.amps:
            entry["amps"] = round(reading.amps[name], 4)
        if name in reading.energy_j:
            entry["energy_j"] = round(reading.energy_j[name], 4)
        rails[name] = entry
    return {"time": time.time(), "total_w": round(reading.total_w, 4), "total_rails": list(meter.total_rails),
            "rails": rails}


def _table(reading: Any, meter: Any) -> str:
    lines = []
    total = set(meter.total_rails)
    for name, w in reading.watts.items():
        parts = [f"  {name:<18} {w:8.3f} W"]
        if name in reading.volts:
            parts.append(f"{reading.volts[name]:7.3f} V")
        if name in reading.amps:
            parts.append(f"{reading.amps[name]:7.3f} A")
        if name in total and len(total) == 1:
            parts.append("(total)")
        lines.append("  ".join(parts))
    if len(total) > 1 or total != {next(iter(reading.watts), None)}:
        what = "sum of " + " + ".join(meter.total_rails) if len(total) > 1 else meter.total_rails[0]
        lines.append(f"  {'total':<18} {reading.total_w:8.3f} W  ({what})")
    return "\n".join(lines)


def _telemetry_line(t: dict[str, Any]) -> str:
    """``temps cpu 51.2C gpu 49.8C  clocks gpu 612MHz emc 2133MHz  load gpu 42%  fan 30%  throttle: none``."""
    parts = []
    if t.get("temperatures_c"):
        parts.append("temps " + " ".join(f"{k} {v:.1f}C" for k, v in t["temperatures_c"].items()))
    if t.get("clocks_mhz"):
        parts.append("clocks " + " ".join(f"{k} {v:.0f}MHz" for k, v in t["clocks_mhz"].items()))
    if t.get("load"):
        parts.append("load " + " ".join(f"{k} {v * 100:.0f}%" for k, v in t["load"].items()))
    if t.get("fan_ratio") is not None:
        parts.append(f"fan {t['fan_ratio'] * 100:.0f}%")
    parts.append("throttle: " + (", ".join(t.get("throttle", [])) or "none"))
    return "  ".join(parts)


def _mode_line() -> str | None:
    from edgert.power import nvpmodel

    st = nvpmodel.status()
    if st["mode_id"] is None:
        return None
    locked = {True: "yes", False: "no", None: "unknown"}[st["clocks_locked"]]
    modes = ", ".join(f"{m['id']}={m['name']}" for m in st["modes"])
    extra = f"; modes: {modes}" if modes else ""
    return f"power mode   {st['mode'] or '?'} ({st['mode_id']}); clocks locked: {locked}{extra}"


def run(args: argparse.Namespace) -> int:
    from edgert.errors import PowerError
    from edgert.power import nvpmodel, open_meter
    from edgert.power.telemetry import TelemetryWatch, read_telemetry

    if args.set_mode is not None:
        out = nvpmodel.set_mode(args.set_mode)
        print(out or f"power mode set to {args.set_mode}")
        return 0
    if args.interval <= 0:
        raise PowerError(f"--interval must be > 0 seconds, got {args.interval}")

    meter = open_meter(args.meter)
    with meter:
        if not meter.available:
            telemetry = read_telemetry()
            if args.json:
                # no meter is JSON null, not the null meter's name (a string a program would take for one)
                print(json.dumps({**meter.info(), "meter": None, "reason": getattr(meter, "reason", ""),
                                  "telemetry": telemetry}))
            else:
                print(f"no power meter on this machine: {getattr(meter, 'reason', meter.description)}")
                if len(telemetry) > 1:
                    print(f"telemetry    {_telemetry_line(telemetry)}")
            return 0
        if not args.watch:
            reading = meter.read()
            if args.json:
                print(json.dumps({**meter.info(), "reading": _reading_dict(reading, meter),
                                  "telemetry": read_telemetry(), "power_mode": nvpmodel.status()}, indent=2))
                return 0
            print(f"meter        {meter.description}")
            print(_table(reading, meter))
            print(f"telemetry    {_telemetry_line(read_telemetry())}")
            mode = _mode_line()
            if mode:
                print(mode)
            return 0
        n = 0
        watch = TelemetryWatch()  # over-current counters are read as increments between readings
        t0 = time.monotonic()
        if not args.json:
            print(f"meter        {meter.description}")
        while args.count is None or n < args.count:
            if n:
                time.sleep(args.interval)
            reading = meter.read()
            telemetry = watch.update(time.monotonic() - t0, 0.0)
            if args.json:
                print(json.dumps({**_reading_dict(reading, meter), "telemetry": telemetry}))
            else:
                rails = "  ".join(f"{k} {v:.3f} W" for k, v in reading.watts.items())
                print(f"{time.strftime('%H:%M:%S')}  {rails}  total {reading.total_w:.3f} W  "
                      f"{_telemetry_line(telemetry)}")
            sys.stdout.flush()
            n += 1
    return 0
