"""Engine files (plain plans, Ultralytics headers) and the sidecar's compatibility rules, without TensorRT."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from edgert.builder.onnx_info import file_sha256
from edgert.builder.target import CPU_BUILD, GpuIdentity
from edgert.engine.file import read_engine_file, split_ultralytics_header, write_atomic
from edgert.engine.sidecar import (
    EngineRecord,
    cached_engine_matches,
    check_loadable,
    compare,
    read_sidecar,
    sidecar_path,
    write_sidecar,
)
from edgert.errors import EngineCacheError

PLAN = b"ftrt\x00\x00\x00\x00" + bytes(range(256)) * 4


def ultralytics_engine(path: Path, meta: dict[str, object], plan: bytes = PLAN) -> Path:
    """What Ultralytics' exporter writes: 4-byte little-endian length, JSON metadata, then the plan."""
    blob = json.dumps(meta).encode()
    path.write_bytes(len(blob).to_bytes(4, byteorder="little", signed=True) + blob + plan)
    return path


def test_ultralytics_header_is_read_and_stripped(tmp_path: Path) -> None:
    meta = {"names": {"0": "Normal", "1": "Fall"}, "imgsz": [640, 640], "stride": 32, "task": "detect"}
    ef = read_engine_file(ultralytics_engine(tmp_path / "m.engine", meta))
    assert ef.is_ultralytics and ef.metadata == meta and ef.plan == PLAN


def test_plain_plans_stay_whole(tmp_path: Path) -> None:
    p = tmp_path / "plain.engine"
    p.write_bytes(PLAN)
    ef = read_engine_file(p)
    assert not ef.is_ultralytics and ef.plan == PLAN
    # A plan whose first 4 bytes happen to read as a small length but is not followed by JSON stays whole.
    odd = b"\x05\x00\x00\x00{abcd" + PLAN
    assert split_ultralytics_header(odd) == ({}, odd)


def test_missing_and_empty_engines_are_engine_cache_errors(tmp_path: Path) -> None:
    with pytest.raises(EngineCacheError, match="not found"):
        read_engine_file(tmp_path / "none.engine")
    (tmp_path / "empty.engine").write_bytes(b"")
    with pytest.raises(EngineCacheError, match="empty"):
        read_engine_file(tmp_path / "empty.engine")


def _record(**kw: object) -> EngineRecord:
    base = EngineRecord(onnx_sha256="a" * 64, backend="tensorrt", trt_version="10.3.0", precision="fp16",
                        calibration_cache_sha256=None, profiles=[], builder_flags={"workspace_mib": None},
                        gpu=GpuIdentity("Orin (nvgpu)", "8.7"), onnx_path="m.onnx")
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("change, needle", [
    ({"trt_version": "10.7.0"}, "built with tensorrt 10.3.0, this machine has 10.7.0"),
    ({"gpu": GpuIdentity("NVIDIA H200", "9.0")}, "built for GPU Orin (nvgpu) (compute 8.7)"),
    ({"onnx_sha256": "b" * 64}, "ONNX file changed"),
    ({"precision": "int8"}, "precision fp16, int8 asked"),
    ({"calibration_cache_sha256": "c" * 64}, "calibration cache changed"),
    ({"profiles": [{"name": "x"}]}, "optimization profiles"),
    ({"builder_flags": {"workspace_mib": 512}}, "builder settings differ (workspace_mib)"),
])
def test_compare_names_the_first_difference(change: dict[str, object], needle: str) -> None:
    have = _record()
    assert compare(have, have) is None
    why = compare(have, _record(**change))
    assert why is not None and needle in why


def test_sidecar_round_trip_and_reuse_rules(tmp_path: Path) -> None:
    engine = tmp_path / "m.engine"
    write_atomic(engine, PLAN)
    rec = _record(engine_sha256=file_sha256(engine), engine_bytes=len(PLAN))
    write_sidecar(engine, rec)
    assert sidecar_path(engine).name == "m.engine.json"
    assert read_sidecar(engine) == rec
    assert cached_engine_matches(engine, _record()) == (True, "matches")
    engine.write_bytes(PLAN + b"x")  # replaced behind the sidecar's back
    ok, why = cached_engine_matches(engine, _record())
    assert not ok and "differs from the one the sidecar describes" in why
    sidecar_path(engine).write_text("{not json")
    ok, why = cached_engine_matches(engine, _record())
    assert not ok and "damaged sidecar" in why


def test_loading_a_foreign_engine_names_the_rebuild(tmp_path: Path) -> None:
    engine = tmp_path / "m.engine"
    engine.write_bytes(PLAN)
    write_sidecar(engine, _record())
    here = GpuIdentity("Orin (nvgpu)", "8.7")
    assert check_loadable(engine, "tensorrt", "10.3.0", here) is not None
    with pytest.raises(EngineCacheError, match=r"built with tensorrt 10\.3\.0, this machine has 8\.6\.2; "
                                               r"rebuild it: edgert build m\.onnx --backend tensorrt"):
        check_loadable(engine, "tensorrt", "8.6.2", here)
    with pytest.raises(EngineCacheError, match=r"compute 8\.7\), this GPU is NVIDIA H200 \(compute 9\.0\)"):
        check_loadable(engine, "tensorrt", "10.3.0", GpuIdentity("NVIDIA H200", "9.0"))
    with pytest.raises(EngineCacheError, match="built for tensorrt, not tensorrt-rtx"):
        check_loadable(engine, "tensorrt-rtx", "10.3.0", here)
    # TensorRT-RTX engines built without a GPU are compiled for the GPU at load: any compute capability.
    write_sidecar(engine, _record(backend="tensorrt-rtx", gpu=GpuIdentity(CPU_BUILD, None)))
    assert check_loadable(engine, "tensorrt-rtx", "10.3.0", GpuIdentity("RTX 4090", "8.9")) is not None
    # No sidecar (trtexec, Ultralytics, DeepStream engines): TensorRT itself judges.
    sidecar_path(engine).unlink()
    assert check_loadable(engine, "tensorrt", "1.0", here) is None
