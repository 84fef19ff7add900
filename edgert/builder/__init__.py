"""Build time: ONNX inspection, the TensorRT / TensorRT-RTX engine builder, the engine cache and sidecar.

Nothing here is imported by the runtime path: a running pipeline needs only the engine file, read through
:mod:`edgert.engine`. The builder itself is :mod:`edgert.builder.engine_builder`; this package face does not import it,
so reading an engine's sidecar never loads the builder.
"""

from __future__ import annotations

from edgert.builder.onnx_info import OnnxInfo, ShapeProfile, inspect_onnx, parse_shapes
from edgert.engine.file import EngineFile, read_engine_file
from edgert.engine.sidecar import EngineRecord, read_sidecar, sidecar_path

__all__ = [
    "EngineFile",
    "EngineRecord",
    "OnnxInfo",
    "ShapeProfile",
    "inspect_onnx",
    "parse_shapes",
    "read_engine_file",
    "read_sidecar",
    "sidecar_path",
]
