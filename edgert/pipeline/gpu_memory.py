"""Frame memory of the GPU processor: which kind a device gets, and a slot's page-locked staging buffer.

``pinned``: frames sit in page-locked host memory and go up with one DMA each (discrete GPUs); ``zero-copy``:
the letterbox kernel reads mapped page-locked memory in place (integrated GPUs, Jetson: the same DRAM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgert.errors import ConfigError

if TYPE_CHECKING:
    from edgert.backends.cuda import CudaDevice, DeviceBuffer

__all__ = ["ALIGN", "MEMORY_MODES", "Staging", "choose_memory_mode"]

MEMORY_MODES = ("auto", "pinned", "zero-copy")


def choose_memory_mode(requested: str, integrated: bool, can_map: bool) -> str:
    """``"zero-copy"`` or ``"pinned"`` for a device with these traits.

    ``auto``: zero-copy when the GPU is integrated (shares DRAM with the CPU: Jetson) and can map host
    memory, otherwise pinned copies (a discrete GPU would read mapped memory over PCIe). Asking for
    zero-copy on a device that cannot map host memory is a :class:`ConfigError`.
    """
    if requested not in MEMORY_MODES:
        raise ConfigError(f"memory mode {requested!r} is not one of {', '.join(MEMORY_MODES)}")
    if requested == "pinned":
        return "pinned"
    if requested == "zero-copy":
        if not can_map:
            raise ConfigError("runtime.memory: zero-copy: this GPU cannot map host memory (CAN_MAP_HOST_MEMORY "
                              "is 0). Note: use --memory pinned")
        return "zero-copy"
    return "zero-copy" if integrated and can_map else "pinned"


class Staging:
    """One sample's page-locked frame bytes (mapped when zero-copy) and, with pinned copies, its device copy."""

    def __init__(self) -> None:
        self.host: np.ndarray | None = None
        self.ptr = 0  # device address the letterbox kernel reads
        self.device_copy: DeviceBuffer | None = None

    def ensure(self, device: CudaDevice, nbytes: int, zero_copy: bool) -> None:
        if self.host is not None and self.host.nbytes >= nbytes:
            return  # once per frame size: a camera's frames all have one
        with device.active():
            self.free()
            self.host = device.pinned_empty((nbytes,), np.uint8, mapped=zero_copy)
            if zero_copy:
                self.ptr = device.device_pointer_of_mapped(self.host)
            else:
                self.device_copy = device.alloc(nbytes)
                self.ptr = self.device_copy.ptr

    def free(self) -> None:
        if self.device_copy is not None:
            self.device_copy.free()
            self.device_copy = None
        self.host = None


#: Frames of a batch sit this many bytes apart at least in the staging buffer (aligned rows for the kernel).
ALIGN = 256
