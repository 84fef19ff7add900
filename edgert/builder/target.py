"""What an engine is built for: the TensorRT flavour and version, the GPU, the CUDA driver.

TensorRT engines are tied to the TensorRT version and the GPU they were built on (the "version tag does
not match" error at load time). These facts go into each engine's sidecar and the timing cache's name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType

from edgert._lazy import lazy_import
from edgert.engine.identity import CPU_BUILD, GpuIdentity
from edgert.errors import BackendUnavailable, ConfigError
from edgert.platform import gpu_present

__all__ = [
    "CPU_BUILD",
    "GpuIdentity",
    "TargetInfo",
    "build_modules",
    "current_gpu",
    "import_tensorrt",
    "target_info",
]

log = logging.getLogger(__name__)

def build_modules() -> dict[str, str]:
    """edgert backend name -> Python module of that TensorRT flavour, for every backend that builds engines
    (read from the backend registry: each backend says whether it builds)."""
    from edgert.backends import backend_class, engine_builders

    return {name: backend_class(name).build_module for name in engine_builders()}

@dataclass(frozen=True)
class TargetInfo:
    backend: str
    module: str
    trt_version: str
    gpu: GpuIdentity


def import_tensorrt(backend: str) -> ModuleType:
    """The TensorRT module for an edgert backend name, or BackendUnavailable naming the install."""
    modules = build_modules()
    module = modules.get(backend)
    if module is None:
        valid = ", ".join(modules)
        raise ConfigError(f"backend {backend!r} does not build engines. Note: engine backends are {valid}")
    return lazy_import(module, f"the {backend} backend")


def _gpu_from_nvml() -> GpuIdentity | None:
    try:
        pynvml = lazy_import("pynvml")
        pynvml.nvmlInit()
    except Exception:  # not installed, or NVML absent (Jetson Orin answers "not supported")
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return GpuIdentity(name.decode() if isinstance(name, bytes) else str(name), f"{major}.{minor}",
                           driver.decode() if isinstance(driver, bytes) else str(driver))
    except Exception:
        log.debug("NVML query failed", exc_info=True)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            log.debug("nvmlShutdown failed", exc_info=True)


def _gpu_from_pycuda() -> GpuIdentity | None:
    try:
        from edgert.backends.cuda import device_identity

        return GpuIdentity(*device_identity(0))
    except (BackendUnavailable, ImportError):
        return None
    except Exception:
        log.debug("pycuda device query failed", exc_info=True)
        return None


def current_gpu() -> GpuIdentity:
    """This machine's GPU 0, or the CPU-build marker when there is none. Never raises."""
    present, _why = gpu_present()
    if not present:
        return GpuIdentity(CPU_BUILD, None)
    return _gpu_from_nvml() or _gpu_from_pycuda() or GpuIdentity("unknown GPU", None)


def target_info(backend: str, trt: ModuleType | None = None) -> TargetInfo:
    trt = trt or import_tensorrt(backend)
    return TargetInfo(backend, build_modules()[backend], str(getattr(trt, "__version__", "?")), current_gpu())
