"""TensorRT calibration caches: the text file ``IInt8Calibrator.writeCalibrationCache`` produces.

Implicit INT8 (JetPack 5/6 ``trtexec --int8 --calib=FILE``, and DLA, which takes no Q/DQ) reads it::

    TRT-8602-EntropyCalibration2
    images: 3c010204
    /model.0/conv/Conv_output_0: 3d8f5c29

One ``tensor: scale`` line per tensor, the scale (``amax / 127``) written as the 8 hex digits of its
IEEE-754 float32 bits, most significant first (``struct.pack(">f", scale).hex()``; NVIDIA's TAO export
writes the same bits as ``hex(struct.unpack("i", struct.pack("f", s))[0])``). The header names the
TensorRT version as TensorRT's ``NV_TENSORRT_VERSION`` does (8.6.2 -> 8602; 10.3.0 -> 100300) and the
calibrator algorithm; TensorRT refuses a cache whose header names another algorithm or version than the
calibrator building the engine, so both are parameters. Tensor names are the ONNX tensor names, which
TensorRT's ONNX parser keeps.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from pathlib import Path

from edgert.atomic_file import write_atomic
from edgert.errors import CalibrationError

__all__ = [
    "ALGORITHMS",
    "cache_trt_version",
    "format_cache",
    "parse_cache",
    "read_cache",
    "scale_from_hex",
    "scale_to_hex",
    "trt_version_number",
    "write_cache",
]

#: The first TensorRT without implicit INT8 (no calibrators, no calibration caches: Q/DQ only).
NO_IMPLICIT_INT8_MAJOR = 11
JETPACK_VERSIONS = "8.5.2 for JetPack 5.1, 8.6.2 for JetPack 6.0/6.1, 10.3.0 for JetPack 6.2"
ALGORITHMS = ("EntropyCalibration2", "EntropyCalibration", "MinMaxCalibration", "LegacyCalibration")
_HEADER = re.compile(r"^TRT-(\d+)-(\w+)$")
_LINE = re.compile(r"^(.+): ([0-9a-fA-F]{1,8})$")


def trt_version_number(version: str) -> int:
    """``"8.6.2"`` -> 8602, ``"10.3.0"`` -> 100300 (TensorRT changed the encoding at 10)."""
    parts = version.strip().split(".")
    try:
        major, minor, patch = (int(p) for p in [*parts, "0", "0"][:3])
    except ValueError:
        raise CalibrationError(f"TensorRT version {version!r} is not MAJOR.MINOR.PATCH, e.g. 8.6.2") from None
    if major >= 10:
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def cache_trt_version(requested: str | None = None) -> tuple[str | None, str]:
    """The TensorRT version a calibration cache is written for, and why: ``(None, why)`` when none is.

    ``requested`` (``--trt-version``) wins; otherwise the installed ``tensorrt`` module's version, where that
    TensorRT still has implicit INT8 (calibrators; gone in TensorRT 11, never in TensorRT-RTX). A cache for
    a TensorRT without implicit INT8 would never be read, so none is written.
    """
    if requested:
        trt_version_number(requested)  # validates
        if int(requested.split(".")[0]) >= NO_IMPLICIT_INT8_MAJOR:
            raise CalibrationError(f"TensorRT {requested} has no implicit INT8 (calibration caches): it builds the "
                                   "Q/DQ model. Note: leave out --trt-version, or name a TensorRT 8.x-10.x")
        return requested, "--trt-version"
    try:
        import importlib

        trt = importlib.import_module("tensorrt")
    except ImportError:
        return None, (f"no TensorRT here to name in the cache header; give --trt-version ({JETPACK_VERSIONS}) "
                      "to write one for implicit INT8")
    version = str(getattr(trt, "__version__", "") or "")
    if not version:  # the stub-only package (tensorrt-stubs) imports as an empty namespace
        return None, f"no TensorRT here; give --trt-version ({JETPACK_VERSIONS}) to write a calibration cache"
    version = ".".join(version.split(".")[:3])
    if not hasattr(trt, "IInt8EntropyCalibrator2"):
        return None, f"TensorRT {version} has no implicit INT8 (it builds the Q/DQ model); no cache written"
    return version, f"installed TensorRT {version}"


def scale_to_hex(scale: float) -> str:
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"a calibration scale must be finite and > 0, got {scale}")  # an edgert bug
    return struct.pack(">f", scale).hex()


def scale_from_hex(text: str) -> float:
    value: float = struct.unpack(">f", bytes.fromhex(text.rjust(8, "0")))[0]
    return value


def format_cache(scales: Mapping[str, float], trt_version: str,
                 algorithm: str = "EntropyCalibration2") -> str:
    if algorithm not in ALGORITHMS:
        raise CalibrationError(f"unknown calibration algorithm {algorithm!r}. Note: valid: {', '.join(ALGORITHMS)}")
    lines = [f"TRT-{trt_version_number(trt_version)}-{algorithm}"]
    for name, scale in scales.items():
        if "\n" in name or ": " in name:
            raise CalibrationError(f"tensor name {name!r} cannot be written to a TensorRT calibration cache")
        lines.append(f"{name}: {scale_to_hex(scale)}")
    return "\n".join(lines) + "\n"


def write_cache(path: str | Path, scales: Mapping[str, float], trt_version: str,
                algorithm: str = "EntropyCalibration2") -> Path:
    p = Path(path)
    try:
        write_atomic(p, format_cache(scales, trt_version, algorithm).encode("ascii"))
    except OSError as exc:
        raise CalibrationError(f"{p}: cannot write the calibration cache: {exc}") from exc
    return p


def parse_cache(text: str) -> tuple[int, str, dict[str, float]]:
    """``(version number, algorithm, {tensor: scale})``; a malformed file is a CalibrationError."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise CalibrationError("calibration cache is empty")
    head = _HEADER.match(lines[0].strip())
    if head is None:
        raise CalibrationError(f"calibration cache header {lines[0][:60]!r} is not TRT-<version>-<algorithm>")
    scales: dict[str, float] = {}
    for n, line in enumerate(lines[1:], start=2):
        m = _LINE.match(line.rstrip())
        if m is None:
            raise CalibrationError(f"calibration cache line {n}: {line[:60]!r} is not 'tensor: hexscale'")
        if m.group(1) in scales:
            raise CalibrationError(f"calibration cache line {n}: tensor {m.group(1)!r} listed twice")
        scales[m.group(1)] = scale_from_hex(m.group(2))
    return int(head.group(1)), head.group(2), scales


def read_cache(path: str | Path) -> tuple[int, str, dict[str, float]]:
    p = Path(path)
    try:
        text = p.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{p}: cannot read the calibration cache: {exc}") from exc
    return parse_cache(text)
