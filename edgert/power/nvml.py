"""NVIDIA GPUs through NVML (``pynvml`` from the ``nvidia-ml-py`` package): one rail per GPU.

``nvmlDeviceGetPowerUsage`` gives milliwatts (on recent data-centre GPUs a one-second average);
``nvmlDeviceGetTotalEnergyConsumption`` (Volta and newer) gives millijoules since the driver loaded,
which the sampler prefers to integrating samples. On Jetson (Orin) NVML answers "not supported" for
power: this meter then refuses to open, with that reason, and ``open_meter("auto")`` moves on.

Because the watts are a one-second average while joules come from the counter, a sampler's ``peak_w``
(the largest reading) can come out below its ``avg_w`` (energy / time) over a short, steady run; the
energy and mJ/frame figures are the accurate ones.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from edgert._lazy import lazy_import
from edgert.errors import PowerError
from edgert.power.clock import Clock
from edgert.power.meter import PowerMeter, PowerReading

__all__ = ["NvmlMeter"]

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlMeter(PowerMeter):
    """Power (and the energy counter where present) of each GPU NVML can measure; rails ``GPU0``..."""

    kind = "nvml"

    def __init__(self, devices: Sequence[int] | None = None, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self._nvml = lazy_import("pynvml", "NVML power readings")
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise PowerError(f"NVML unavailable: {exc}") from exc
        self._open = True
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._energy_ok: dict[str, bool] = {}
        self._energy0: dict[str, float] = {}
        self.names: dict[str, str] = {}
        skipped = []
        try:
            indices = list(devices) if devices is not None else list(range(nv.nvmlDeviceGetCount()))
            for i in indices:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                name = _text(nv.nvmlDeviceGetName(handle))
                try:
                    nv.nvmlDeviceGetPowerUsage(handle)
                except nv.NVMLError as exc:
                    skipped.append(f"GPU{i} ({name}): power {exc}")
                    continue
                rail = f"GPU{i}"
                self._handles[rail] = handle
                self.names[rail] = name
                try:
                    self._energy0[rail] = float(nv.nvmlDeviceGetTotalEnergyConsumption(handle))
                    self._energy_ok[rail] = True
                except nv.NVMLError as exc:
                    log.info("GPU%d (%s): no energy counter (%s); watts will be integrated", i, name, exc)
                    self._energy_ok[rail] = False
        except nv.NVMLError as exc:
            self.close()
            raise PowerError(f"NVML failed while listing GPUs: {exc}") from exc
        if not self._handles:
            self.close()
            why = "; ".join(skipped) if skipped else "no GPU found"
            raise PowerError(f"NVML cannot measure power here: {why}")
        self._rails = tuple(self._handles)

    @property
    def has_energy_counter(self) -> bool:
        return all(self._energy_ok.values())

    @property
    def description(self) -> str:
        gpus = ", ".join(f"{r} {self.names[r]}" for r in self.rails)
        counter = "energy counter" if self.has_energy_counter else "no energy counter"
        return f"NVML ({counter}): {gpus}"

    def read(self) -> PowerReading:
        nv = self._nvml
        watts: dict[str, float] = {}
        energy: dict[str, float] = {}
        with self._lock:
            if not self._open:
                raise PowerError("NVML meter is closed")
            now = self.clock.now()
            try:
                for rail, handle in self._handles.items():
                    watts[rail] = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0
                    if self._energy_ok[rail]:
                        mj = float(nv.nvmlDeviceGetTotalEnergyConsumption(handle))
                        energy[rail] = (mj - self._energy0[rail]) / 1000.0
            except nv.NVMLError as exc:
                raise PowerError(f"NVML read failed: {exc}") from exc
        return PowerReading(now, watts, self._sum_total(watts), energy_j=energy)

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                log.debug("nvmlShutdown failed", exc_info=True)
