"""Jetson power modes (nvpmodel) and whether jetson_clocks has locked the clocks.

edgert only reads these. A mode name is a clock cap, not a power budget (an Orin NX in its "25W" mode
has been measured at 29 W sustained); to hold a pipeline to watts use ``--power-budget``. Changing the
mode happens only when asked (``edgert power --set-mode N``) and needs root.

* ``/etc/nvpmodel.conf`` defines the modes: ``< POWER_MODEL ID=0 NAME=MAXN >`` lines, and the
  default in ``< PM_CONFIG DEFAULT=2 >``.
* ``nvpmodel -q`` prints ``NV Power Mode: MAXN`` and the mode id on the next line;
  ``/var/lib/nvpmodel/status`` holds ``pmode:0002`` (read when the command is absent, and in tests).
* jetson_clocks pins each clock's minimum to its maximum; equal ``scaling_min_freq`` and
  ``scaling_max_freq`` on cpu0 is the sign it ran.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from edgert.errors import PowerError
from edgert.platform import sysroot

__all__ = ["PowerMode", "clocks_locked", "parse_conf", "parse_query", "read_modes", "set_mode", "status"]

_MODEL = re.compile(r"^\s*<\s*POWER_MODEL\s+([^>]*)>", re.MULTILINE)
_DEFAULT = re.compile(r"^\s*<\s*PM_CONFIG\s+DEFAULT\s*=\s*(\d+)\s*>", re.MULTILINE)
_ATTR = re.compile(r"(\w+)\s*=\s*(\S+)")


@dataclass(frozen=True)
class PowerMode:
    id: int
    name: str


def parse_conf(text: str) -> tuple[list[PowerMode], int | None]:
    """Modes defined in an nvpmodel.conf, and the default mode id (None when the file names none)."""
    modes = []
    for m in _MODEL.finditer(text):
        attrs = dict(_ATTR.findall(m.group(1)))
        if "ID" in attrs and attrs["ID"].isdigit():
            modes.append(PowerMode(int(attrs["ID"]), attrs.get("NAME", f"mode {attrs['ID']}")))
    d = _DEFAULT.search(text)
    return modes, int(d.group(1)) if d else None


def parse_query(text: str) -> tuple[str | None, int | None]:
    """(name, id) from the output of ``nvpmodel -q``."""
    m = re.search(r"NV Power Mode:[ \t]*(\S+)[ \t]*(?:\r?\n\s*(\d+))?", text)
    if not m:
        return None, None
    return m.group(1), int(m.group(2)) if m.group(2) else None


def _read(rel: str) -> str | None:
    try:
        return (sysroot() / rel).read_text(errors="replace")
    except OSError:
        return None


def read_modes() -> tuple[list[PowerMode], int | None]:
    text = _read("etc/nvpmodel.conf")
    return parse_conf(text) if text else ([], None)


def clocks_locked() -> bool | None:
    """True when cpu0's minimum frequency equals its maximum (jetson_clocks ran); None if unknown."""
    lo = _read("sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq")
    hi = _read("sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq")
    if lo is None or hi is None:
        return None
    return lo.strip() == hi.strip()


def status() -> dict[str, Any]:
    """Current mode (id and name), the modes defined, the default, and whether clocks are locked."""
    modes, default = read_modes()
    names = {m.id: m.name for m in modes}
    out: dict[str, Any] = {
        "mode_id": None, "mode": None, "default_id": default,
        "modes": [{"id": m.id, "name": m.name} for m in modes],
        "clocks_locked": clocks_locked(),
    }
    exe = shutil.which("nvpmodel") if str(sysroot()) == "/" else None
    if exe:
        try:
            text = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            out["why"] = f"nvpmodel -q failed: {exc}"
        else:
            name, mode_id = parse_query(text)
            out["mode"], out["mode_id"] = name, mode_id
    if out["mode_id"] is None:
        st = _read("var/lib/nvpmodel/status")
        m = re.search(r"pmode:(\d+)", st or "")
        if m:
            out["mode_id"] = int(m.group(1))
    if out["mode"] is None and out["mode_id"] is not None:
        out["mode"] = names.get(out["mode_id"])
    if out["mode_id"] is None and "why" not in out:
        out["why"] = "not a Jetson (no nvpmodel)"
    return out


def set_mode(mode_id: int) -> str:
    """Switch to power mode ``mode_id`` with ``nvpmodel -m``. Root only; returns nvpmodel's output."""
    modes, _ = read_modes()
    if modes and mode_id not in {m.id for m in modes}:
        valid = ", ".join(f"{m.id} ({m.name})" for m in modes)
        raise PowerError(f"power mode {mode_id} is not defined in /etc/nvpmodel.conf. Note: modes are {valid}")
    exe = shutil.which("nvpmodel")
    if exe is None:
        raise PowerError("nvpmodel not found: power modes exist only on Jetson (JetPack)")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise PowerError(f"changing the power mode needs root: run sudo edgert power --set-mode {mode_id}")
    result = subprocess.run([exe, "-m", str(mode_id)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()
        raise PowerError(f"nvpmodel -m {mode_id} failed: {tail[-1] if tail else 'exit ' + str(result.returncode)}")
    return result.stdout.strip()
