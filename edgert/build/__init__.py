"""Build time: ONNX inspection, the TensorRT / TensorRT-RTX engine builder, the engine cache and sidecar.

Nothing here is imported by the runtime path: a running pipeline needs only the engine file.
"""

from __future__ import annotations

from edgert.build.builder import PRECISIONS, BuildOptions, BuildResult, build_engine
from edgert.build.engine_cache import EngineRecord, read_sidecar, sidecar_path
from edgert.build.engine_file import EngineFile, read_engine_file
from edgert.build.onnx_info import OnnxInfo, ShapeProfile, inspect_onnx, parse_shapes

__all__ = [
    "PRECISIONS",
    "BuildOptions",
    "BuildResult",
    "EngineFile",
    "EngineRecord",
    "OnnxInfo",
    "ShapeProfile",
    "build_engine",
    "inspect_onnx",
    "parse_shapes",
    "read_engine_file",
    "read_sidecar",
    "sidecar_path",
]
