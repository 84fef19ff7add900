"""A simulated board: a public test double for the budget controller, and for trying edgert without one.

Physics: the board draws ``idle_w`` plus ``joules_per_frame`` for every frame it processes; the meter
sees that demand through a first-order lag of time constant ``lag_s`` (regulators, the INA's own
averaging) with Gaussian noise of ``noise_w`` on top. The board processes one frame at a time at most
``max_fps`` frames per second, so its unconstrained draw is ``idle_w + joules_per_frame * max_fps``.

Work is real: :meth:`SimulatedBoard.process_frame` blocks the calling thread for the frame's duration
(on the board's clock, which may be a :class:`~edgert.power.clock.ScaledClock` to run faster than real
time), and :meth:`read` advances the lag exactly over the frames processed since the last read.
"""

from __future__ import annotations

import math
import random
import threading

from edgert.power.clock import Clock
from edgert.power.meter import PowerMeter, PowerReading

__all__ = ["SimulatedBoard"]


class SimulatedBoard(PowerMeter):
    """A meter whose readings follow the frames processed on it (see the module docstring)."""

    kind = "simulated"

    def __init__(
        self,
        idle_w: float = 3.0,
        joules_per_frame: float = 0.2,
        max_fps: float = 60.0,
        lag_s: float = 0.3,
        noise_w: float = 0.05,
        seed: int = 0,
        clock: Clock | None = None,
        rail: str = "VDD_IN",
        part_rail: str = "VDD_CPU_GPU_CV",
    ) -> None:
        super().__init__(clock)
        if idle_w < 0 or joules_per_frame <= 0 or max_fps <= 0 or lag_s <= 0 or noise_w < 0:
            raise ValueError("SimulatedBoard needs idle_w >= 0, joules_per_frame, max_fps, lag_s > 0, noise_w >= 0")
        self.idle_w = idle_w
        self.joules_per_frame = joules_per_frame
        self.max_fps = max_fps
        self.lag_s = lag_s
        self.noise_w = noise_w
        self.rail = rail
        self.part_rail = part_rail  # the part of the draw that frames cause, as a second rail
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._busy_until = self.clock.now()
        self._frames = 0
        self._frames_seen = 0
        self._t = self.clock.now()
        self._power = idle_w  # the lagged (true, noiseless) draw

    @property
    def unconstrained_w(self) -> float:
        """The draw when frames arrive as fast as the board can take them."""
        return self.idle_w + self.joules_per_frame * self.max_fps

    @property
    def frames(self) -> int:
        return self._frames

    @property
    def rails(self) -> tuple[str, ...]:
        return (self.rail, self.part_rail)

    @property
    def total_rails(self) -> tuple[str, ...]:
        return (self.rail,)

    @property
    def description(self) -> str:
        return (f"simulated board: {self.idle_w:g} W idle + {self.joules_per_frame:g} J/frame, "
                f"at most {self.max_fps:g} fps, lag {self.lag_s:g} s")

    def process_frame(self) -> None:
        """Do one frame of work: occupy the board for ``1/max_fps`` seconds (frames queue behind each other)."""
        period = 1.0 / self.max_fps
        with self._lock:
            now = self.clock.now()
            # Deadline-based, so the board's throughput is max_fps however late the thread wakes up.
            start = max(now, self._busy_until)
            self._busy_until = start + period
            self._frames += 1
            done = self._busy_until
        self.clock.sleep(done - now)

    def _advance(self) -> None:
        now = self.clock.now()
        dt = now - self._t
        if dt <= 0:
            return
        frames = self._frames - self._frames_seen
        demand = self.idle_w + self.joules_per_frame * frames / dt
        # Exact response of a first-order lag to a demand held constant over dt.
        self._power = demand + (self._power - demand) * math.exp(-dt / self.lag_s)
        self._frames_seen = self._frames
        self._t = now

    def read(self) -> PowerReading:
        with self._lock:
            self._advance()
            total = max(0.0, self._power + self._rng.gauss(0.0, self.noise_w))
            part = max(0.0, self._power - self.idle_w + 0.5)
            now = self._t
        return PowerReading(now, {self.rail: total, self.part_rail: part}, total)
