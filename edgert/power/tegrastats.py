"""tegrastats as a power meter: the fallback when the INA sysfs files cannot be read.

tegrastats prints one line per interval; its power fields are ``NAME now/avg``. The unit changed over
JetPack releases, the rail names change by module:

* JetPack 5/6 (Orin, Xavier): ``VDD_IN 4968mW/4968mW VDD_CPU_GPU_CV 436mW/436mW VDD_SOC 1708mW/1708mW``
* JetPack 4 (Xavier NX): ``VDD_IN 4067/4067 VDD_CPU_GPU_CV 738/738 VDD_SOC 1353/1353`` (mW, no unit)
* JetPack 4 (Nano): ``POM_5V_IN 2003/2003 POM_5V_GPU 0/0 POM_5V_CPU 320/320``
* JetPack 4 (AGX Xavier): ``GPU 0/0 CPU 311/311 SOC 932/932 CV 0/0 VDDRQ 621/621 SYS5V 1482/1482``

Other ``a/b`` fields (``RAM 1273/7620MB``, ``SWAP 0/3886MB``, ``IRAM 0/252kB``) carry a unit other than
mW and are not rails. The ``now`` value is used; ``avg`` is tegrastats' own running mean.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from edgert.errors import PowerError
from edgert.platform import sysroot
from edgert.power.clock import Clock
from edgert.power.jetson_ina import total_rails_for
from edgert.power.meter import PowerMeter, PowerReading

__all__ = ["TegrastatsMeter", "find_tegrastats", "parse_rails"]

log = logging.getLogger(__name__)

# "VDD_IN 4968mW/4968mW" or "VDD_IN 4968mW" (milliwatts with their unit)
_RAIL_MW = re.compile(r"(?<![\w@/])([A-Za-z][A-Za-z0-9_]*) (\d+)mW(?:/(\d+)mW)?(?=\s|$)")
# "POM_5V_IN 2003/2003" (JetPack 4: milliwatts, no unit; a unit after the second number means not a rail)
_RAIL_BARE = re.compile(r"(?<![\w@/])([A-Za-z][A-Za-z0-9_]*) (\d+)/(\d+)(?=\s|$)")


def parse_rails(line: str) -> dict[str, tuple[float, float]]:
    """Rail -> (watts now, tegrastats' average watts) from one tegrastats line; {} when it has none."""
    rails: dict[str, tuple[float, float]] = {}
    for m in _RAIL_MW.finditer(line):
        now = int(m.group(2)) / 1000.0
        avg = int(m.group(3)) / 1000.0 if m.group(3) else now
        rails[m.group(1)] = (now, avg)
    if not rails:
        for m in _RAIL_BARE.finditer(line):
            rails[m.group(1)] = (int(m.group(2)) / 1000.0, int(m.group(3)) / 1000.0)
    return rails


def find_tegrastats() -> Path | None:
    """The tegrastats executable: under the sysroot when one is set (tests), else on PATH or /usr/bin."""
    root = sysroot()
    if str(root) != "/":
        candidate = root / "usr/bin/tegrastats"
        return candidate if candidate.exists() else None
    found = shutil.which("tegrastats")
    if found:
        return Path(found)
    candidate = Path("/usr/bin/tegrastats")
    return candidate if candidate.exists() else None


class TegrastatsMeter(PowerMeter):
    """Runs ``tegrastats --interval MS`` and keeps the latest line's rails.

    Opening waits for the first line (to learn the rails); ``read()`` returns the latest line and fails
    when tegrastats has been silent for longer than ``stale_s``.
    """

    kind = "tegrastats"

    def __init__(
        self,
        interval_ms: int = 100,
        command: Sequence[str] | None = None,
        clock: Clock | None = None,
        first_line_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(clock)
        if command is None:
            exe = find_tegrastats()
            if exe is None:
                raise PowerError("tegrastats not found (it ships with JetPack in /usr/bin)")
            command = [str(exe), "--interval", str(int(interval_ms))]
        self.command = list(command)
        self.interval_s = interval_ms / 1000.0
        self.stale_s = max(1.0, 5 * self.interval_s)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._latest: tuple[float, dict[str, tuple[float, float]]] | None = None
        self._stopped = False
        # stderr goes to a file: a pipe nobody drains could fill and stall tegrastats.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- lives as long as the meter
        try:
            self._proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1
            )
        except OSError as exc:
            self._stderr.close()
            raise PowerError(f"cannot start tegrastats ({self.command[0]}): {exc}") from exc
        self._thread = threading.Thread(target=self._pump, name="edgert-tegrastats", daemon=True)
        self._thread.start()
        with self._cond:
            # Real time: tegrastats runs on the wall clock, whatever clock readings are stamped with.
            self._cond.wait_for(lambda: self._latest is not None or self._stopped, timeout=first_line_timeout_s)
            latest = self._latest
        if latest is None:
            err = self._stderr_tail()
            self.close()
            why = f": {err}" if err else f" within {first_line_timeout_s:g} s"
            raise PowerError(f"tegrastats printed no power rails{why}")
        self._rails = tuple(latest[1])
        self._total_rails = total_rails_for(self._rails)

    def _pump(self) -> None:
        stdout = self._proc.stdout
        if stdout is None:  # cannot happen: Popen was given stdout=PIPE
            return
        for line in stdout:
            rails = parse_rails(line)
            if not rails:
                continue
            with self._cond:
                self._latest = (self.clock.now(), rails)
                self._cond.notify_all()
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            lines = self._stderr.read().strip().splitlines()
        except (OSError, ValueError):
            return ""
        return lines[-1][:200] if lines else ""

    @property
    def description(self) -> str:
        return f"tegrastats ({self.command[0]}): {', '.join(self.rails)}"

    def read(self) -> PowerReading:
        with self._lock:
            latest, stopped = self._latest, self._stopped
        if latest is None or stopped:
            raise PowerError(f"tegrastats stopped: {self._stderr_tail() or 'it exited'}")
        stamp, rails = latest
        now = self.clock.now()
        if now - stamp > self.stale_s * getattr(self.clock, "speed", 1.0):
            raise PowerError(f"tegrastats has printed nothing for {now - stamp:.1f} s")
        watts = {name: now_w for name, (now_w, _avg) in rails.items()}
        return PowerReading(stamp, watts, self._sum_total(watts))

    def close(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=2)
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        stderr = getattr(self, "_stderr", None)
        if stderr is not None:
            stderr.close()
