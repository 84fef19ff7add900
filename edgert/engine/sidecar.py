"""The engine cache: every engine has a sidecar ``OUT.engine.json`` saying what it was built from and for.

``edgert build`` compares the sidecar with what it is asked to build: when the ONNX file, precision,
calibration cache, profiles, builder flags, TensorRT version and GPU all match, the engine is reused;
otherwise it is rebuilt, and the reason is logged ("built with TensorRT 10.3.0, this is 10.7.0"). A
session that loads an engine checks the sidecar first, so a foreign engine fails with a message naming
the rebuild command instead of TensorRT's "version tag does not match".
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgert.engine.file import file_sha256, write_atomic
from edgert.engine.identity import CPU_BUILD, GpuIdentity
from edgert.errors import EngineCacheError

__all__ = [
    "SIDECAR_VERSION",
    "EngineRecord",
    "cached_engine_matches",
    "check_loadable",
    "compare",
    "read_sidecar",
    "sidecar_path",
    "write_sidecar",
]

log = logging.getLogger(__name__)

SIDECAR_VERSION = 1


def sidecar_path(engine: Path) -> Path:
    return engine.with_name(engine.name + ".json")


@dataclass(frozen=True)
class EngineRecord:
    """Contents of a sidecar. The first block is the cache key; the rest describes the build."""

    onnx_sha256: str
    backend: str
    trt_version: str
    precision: str
    calibration_cache_sha256: str | None
    profiles: list[dict[str, Any]]
    builder_flags: dict[str, Any]
    gpu: GpuIdentity
    # -- description, not part of the key --
    onnx_path: str = ""
    engine_sha256: str = ""
    engine_bytes: int = 0
    build_seconds: float = 0.0
    built_at: str = ""
    edgert_version: str = ""
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    built_from: str = ""  # the ONNX TensorRT parsed when it is not onnx_path (the FP16 conversion)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpu"] = self.gpu.to_json()
        return {"edgert_sidecar": SIDECAR_VERSION, **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EngineRecord:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in known}
        values["gpu"] = GpuIdentity.from_json(data.get("gpu"))
        try:
            return cls(**values)
        except TypeError as exc:
            raise EngineCacheError(f"sidecar is missing fields ({exc})") from exc


def read_sidecar(engine: Path) -> EngineRecord | None:
    """The engine's sidecar record, None when there is none. A damaged sidecar raises EngineCacheError."""
    path = sidecar_path(engine)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineCacheError(f"{path}: damaged sidecar ({exc}); delete it and rebuild the engine") from exc
    if not isinstance(data, dict) or data.get("edgert_sidecar") != SIDECAR_VERSION:
        raise EngineCacheError(f"{path}: not an edgert sidecar of version {SIDECAR_VERSION}; rebuild the engine")
    try:
        return EngineRecord.from_json(data)
    except EngineCacheError as exc:
        raise EngineCacheError(f"{path}: {exc}; rebuild the engine") from exc


def write_sidecar(engine: Path, record: EngineRecord) -> Path:
    path = sidecar_path(engine)
    write_atomic(path, (json.dumps(record.to_json(), indent=2, sort_keys=False) + "\n").encode())
    return path


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def compare(have: EngineRecord, want: EngineRecord) -> str | None:
    """Why an engine built as ``have`` does not serve a request for ``want``; None when it does."""
    if have.backend != want.backend:
        return f"built for {have.backend}, {want.backend} asked"
    if have.trt_version != want.trt_version:
        return f"built with {have.backend} {have.trt_version}, this machine has {want.trt_version}"
    if (have.gpu.name, have.gpu.compute_capability) != (want.gpu.name, want.gpu.compute_capability):
        cc = f" (compute {have.gpu.compute_capability})" if have.gpu.compute_capability else ""
        now = f" (compute {want.gpu.compute_capability})" if want.gpu.compute_capability else ""
        return f"built for GPU {have.gpu.name}{cc}, this machine has {want.gpu.name}{now}"
    if have.onnx_sha256 != want.onnx_sha256:
        return "the ONNX file changed since the engine was built"
    if have.precision != want.precision:
        return f"built at precision {have.precision}, {want.precision} asked"
    if have.calibration_cache_sha256 != want.calibration_cache_sha256:
        return "the calibration cache changed"
    if have.profiles != want.profiles:
        return "the optimization profiles (--shapes) differ"
    if have.builder_flags != want.builder_flags:
        diff = sorted(k for k in set(have.builder_flags) | set(want.builder_flags)
                      if have.builder_flags.get(k) != want.builder_flags.get(k))
        return f"builder settings differ ({', '.join(diff)})"
    return None


def cached_engine_matches(engine: Path, want: EngineRecord) -> tuple[bool, str]:
    """(reusable, why) for the engine at ``engine`` against the wanted build."""
    if not engine.exists():
        return False, "no engine yet"
    try:
        have = read_sidecar(engine)
    except EngineCacheError as exc:
        return False, str(exc)
    if have is None:
        return False, "the engine has no sidecar, so what it was built from is unknown"
    why = compare(have, want)
    if why:
        return False, why
    if have.engine_sha256 and file_sha256(engine) != have.engine_sha256:
        return False, "the engine file differs from the one the sidecar describes"
    return True, "matches"


def check_loadable(engine: Path, backend: str, trt_version: str, gpu: GpuIdentity | None) -> EngineRecord | None:
    """Raise EngineCacheError when the sidecar says ``engine`` was built for another TensorRT or GPU.

    Engines without a sidecar (built by trtexec, Ultralytics, DeepStream) pass: TensorRT itself checks them.
    ``gpu`` None checks the TensorRT version only (before CUDA is started).
    """
    record = read_sidecar(engine)
    if record is None:
        return None
    rebuild = f"rebuild it: edgert build {record.onnx_path or 'MODEL.onnx'} --backend {backend} -o {engine}"
    if record.backend != backend:
        raise EngineCacheError(f"{engine}: built for {record.backend}, not {backend}; {rebuild}")
    if record.trt_version != trt_version:
        raise EngineCacheError(
            f"{engine}: built with {record.backend} {record.trt_version}, this machine has {trt_version}; {rebuild}"
        )
    # TensorRT runs an engine on GPUs of the compute capability it was built for. TensorRT-RTX engines
    # built without a GPU (CPU_BUILD) are compiled for the GPU at first load, so they carry none.
    built_cc = record.gpu.compute_capability
    if gpu is None:
        return record
    if record.gpu.name != CPU_BUILD and built_cc and gpu.compute_capability and built_cc != gpu.compute_capability:
        raise EngineCacheError(
            f"{engine}: built for {record.gpu.name} (compute {built_cc}), this GPU is {gpu.name} "
            f"(compute {gpu.compute_capability}); {rebuild}"
        )
    return record
