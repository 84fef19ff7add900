"""Which GPU an engine was built for: what the builder records in the sidecar and the runtime checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CPU_BUILD", "GpuIdentity"]

#: The GPU name recorded for an engine built with no GPU visible (TensorRT-RTX builds without one).
CPU_BUILD = "none (CPU build)"


@dataclass(frozen=True)
class GpuIdentity:
    name: str  # CPU_BUILD when no GPU is visible (TensorRT-RTX builds without one)
    compute_capability: str | None
    cuda_driver: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "compute_capability": self.compute_capability, "cuda_driver": self.cuda_driver}

    @classmethod
    def from_json(cls, data: Any) -> GpuIdentity:
        if not isinstance(data, dict):
            return cls(CPU_BUILD, None)
        return cls(str(data.get("name") or CPU_BUILD), data.get("compute_capability"), data.get("cuda_driver"))
