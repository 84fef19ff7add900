"""Backends: which runtimes exist, and picking the best one for this machine.

Backend modules are imported only when asked for, so ``import edgert.backends`` stays free of every
framework.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from edgert.backends.base import Backend, BackendProbe, Session, SessionOptions
from edgert.errors import BackendUnavailable, ConfigError

__all__ = [
    "AUTO_ORDER",
    "Backend",
    "BackendProbe",
    "Session",
    "SessionOptions",
    "backend_names",
    "choose_backend",
    "get_backend",
    "open_session",
]

# name -> "module:Class". Each module imports its framework lazily.
_REGISTRY: dict[str, str] = {
    "onnxruntime": "edgert.backends.onnxruntime:OnnxRuntimeBackend",
    "onnxruntime-cuda": "edgert.backends.onnxruntime_cuda:OnnxRuntimeCudaBackend",
    "tensorrt": "edgert.backends.tensorrt:TensorRTBackend",
    "tensorrt-rtx": "edgert.backends.tensorrt:TensorRTRTXBackend",
}

#: The order ``auto`` tries: the fastest runtime that can run here wins.
AUTO_ORDER: tuple[str, ...] = ("tensorrt", "tensorrt-rtx", "onnxruntime-cuda", "onnxruntime")


def backend_names() -> list[str]:
    return [n for n in AUTO_ORDER if n in _REGISTRY] + sorted(n for n in _REGISTRY if n not in AUTO_ORDER)


def _load(name: str) -> Backend:
    target = _REGISTRY.get(name)
    if target is None:
        valid = ", ".join(["auto", *backend_names()])
        raise ConfigError(f"unknown backend {name!r}. Note: valid backends are {valid}")
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    backend: Backend = cls()
    return backend


def choose_backend() -> tuple[str, list[BackendProbe]]:
    """The first backend of :data:`AUTO_ORDER` that can run here, and every probe (for ``edgert info``)."""
    probes = [_load(name).probe() for name in AUTO_ORDER if name in _REGISTRY]
    for probe in probes:
        if probe.available:
            return probe.name, probes
    reasons = "; ".join(f"{p.name}: {p.reason}" for p in probes)
    raise BackendUnavailable(f"no backend can run here ({reasons})")


def get_backend(name: str = "auto") -> Backend:
    """The backend called ``name``, or the best available one for ``"auto"``."""
    if name == "auto":
        name, _ = choose_backend()
        return _load(name)
    backend = _load(name)
    probe = backend.probe()
    if not probe.available:
        raise BackendUnavailable(f"backend {name} cannot run here: {probe.reason}")
    return backend


def open_session(model: str | Path, backend: str = "auto", options: SessionOptions | None = None) -> Session:
    """Open ``model`` on ``backend``: the one-call way to get a :class:`Session`."""
    return get_backend(backend).open(model, options)
