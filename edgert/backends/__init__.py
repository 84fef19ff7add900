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
    "BACKENDS",
    "Backend",
    "BackendProbe",
    "Session",
    "SessionOptions",
    "backend_class",
    "backend_names",
    "builds_engines",
    "choose_backend",
    "engine_builders",
    "get_backend",
    "gpu_backends",
    "open_session",
]

#: Every backend, the one table that ``--backend``, ``edgert info`` and the unknown-backend error read:
#: name -> "module:Class". Each module imports its framework lazily, so listing them costs no framework.
#: To add a backend: a module with a :class:`Backend` subclass, and one line here (and in AUTO_ORDER if
#: ``auto`` may pick it).
BACKENDS: dict[str, str] = {
    "onnxruntime": "edgert.backends.onnxruntime:OnnxRuntimeBackend",
    "onnxruntime-cuda": "edgert.backends.onnxruntime_cuda:OnnxRuntimeCudaBackend",
    "tensorrt": "edgert.backends.tensorrt:TensorRTBackend",
    "tensorrt-rtx": "edgert.backends.tensorrt:TensorRTRTXBackend",
}

#: The order ``auto`` tries: the fastest runtime that can run here wins.
AUTO_ORDER: tuple[str, ...] = ("tensorrt", "tensorrt-rtx", "onnxruntime-cuda", "onnxruntime")


def backend_names() -> list[str]:
    return [n for n in AUTO_ORDER if n in BACKENDS] + sorted(n for n in BACKENDS if n not in AUTO_ORDER)


def backend_class(name: str) -> type[Backend]:
    """The :class:`Backend` subclass registered as ``name`` (its module imported, its framework not)."""
    target = BACKENDS.get(name)
    if target is None:
        valid = ", ".join(["auto", *backend_names()])
        raise ConfigError(f"unknown backend {name!r}. Note: valid backends are {valid}")
    module_name, cls_name = target.split(":")
    cls: type[Backend] = getattr(importlib.import_module(module_name), cls_name)
    return cls


def builds_engines(name: str) -> bool:
    """Whether backend ``name`` runs built engines (an ONNX model needs ``edgert build`` first); False for
    ``auto`` and unknown names."""
    return name in BACKENDS and backend_class(name).builds_engines


def engine_builders() -> tuple[str, ...]:
    """The backends ``edgert build`` builds for, in :func:`backend_names` order."""
    return tuple(name for name in backend_names() if builds_engines(name))


def gpu_backends() -> tuple[str, ...]:
    """The backends whose sessions run on a CUDA device (the GPU processor's), in :func:`backend_names` order."""
    return tuple(name for name in backend_names() if backend_class(name).gpu_sessions)


def _load(name: str) -> Backend:
    return backend_class(name)()


def choose_backend() -> tuple[str, list[BackendProbe]]:
    """The first backend of :data:`AUTO_ORDER` that can run here, and every probe (for ``edgert info``)."""
    probes = [_load(name).probe() for name in AUTO_ORDER if name in BACKENDS]
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
