"""What the benchmark scripts share: the assets folder, machine facts, JSON output, peak-RSS probing, and
GPU energy through :mod:`edgert.power`.

Scripts import the installed edgert (``pip install -e .``), never a path edited into ``sys.path``.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

from edgert.pipeline import BaseObserver, PipelineStats

__all__ = ["ROOT", "Energy", "RssProbe", "assets_dir", "machine_info", "write_json"]

ROOT = Path(__file__).resolve().parents[1]


def assets_dir() -> Path:
    """``$EDGERT_ASSETS``, else ``../shared/assets`` beside the project."""
    return Path(os.environ.get("EDGERT_ASSETS", ROOT.parent / "shared" / "assets"))


def machine_info() -> dict[str, Any]:
    """edgert's own platform report (the one ``edgert info`` prints) plus the load average now."""
    from edgert.cli.info import machine_report

    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "loadavg": list(os.getloadavg()), "time": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                                   time.gmtime())}
    try:
        info["platform"] = machine_report()
    except Exception as exc:  # a report must never stop a benchmark
        info["platform_error"] = str(exc)
    return info


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return out


class RssProbe(BaseObserver):
    """Peak RSS (``ru_maxrss``, KiB on Linux) of this process when the run passes each of ``marks`` frames."""

    def __init__(self, marks: tuple[int, ...]) -> None:
        self.marks = set(marks)
        self.peak_kib: dict[int, int] = {}

    def on_frame(self, stats: PipelineStats) -> None:
        if stats.frames in self.marks:
            self.peak_kib[stats.frames] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class Energy:
    """GPU 0's energy counter (millijoules) through edgert's NVML meter; ``read()`` is None where there is no
    counter (CPU runs, GPUs before Volta), so callers report no mJ/frame rather than a guess."""

    def __init__(self, enabled: bool) -> None:
        self.meter: Any = None
        if not enabled:
            return
        try:
            from edgert.power.nvml import NvmlMeter

            meter = NvmlMeter(devices=[0])
        except Exception as exc:  # no NVML here: the benchmark still runs
            print(f"no NVML energy counter: {exc}", flush=True)
            return
        if meter.has_energy_counter:
            self.meter = meter
        else:
            meter.close()
            print("no NVML energy counter on GPU 0", flush=True)

    def read(self) -> float | None:
        if self.meter is None:
            return None
        return 1000.0 * sum(self.meter.read().energy_j.values())
