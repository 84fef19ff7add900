"""The model a batch rewrite reads: loading it, its real inputs and their dims, and the rewrite's error."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import numpy as np
import onnx

from edgert.errors import ModelError
from edgert.onnx_file import read_onnx

__all__ = ["BATCH_DIM", "ONNX_NP", "BatchRewriteError", "ModelLike", "dims", "has_dynamic_batch", "load_model",
           "real_inputs"]

#: The name the rewritten inputs and outputs give their first dimension.
BATCH_DIM = "batch"

ModelLike = Union[onnx.ModelProto, str, Path]


class BatchRewriteError(ModelError):
    """The batch dimension of this model cannot be made dynamic (or the rewrite changed its outputs).

    ``node`` is the node's name where one is at fault; the message is one line.
    """

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node



#: numpy types of the ONNX element types a probe or a check feeds.
ONNX_NP: dict[int, Any] = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.INT16: np.int16,
}


def load_model(model: ModelLike, label: str | None = None) -> tuple[onnx.ModelProto, str]:
    """The model and how errors name it (the file name, or the graph name of a ModelProto)."""
    if isinstance(model, onnx.ModelProto):
        return model, label or model.graph.name or "model"
    path = Path(model)
    return read_onnx(path), label or path.name


def real_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def dims(vi: onnx.ValueInfoProto) -> list[Union[int, str]]:
    out: list[Union[int, str]] = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?"))
    return out


def has_dynamic_batch(model: ModelLike) -> bool:
    """True when every input's first dimension is already symbolic (nothing to rewrite)."""
    proto, _ = load_model(model)
    ins = real_inputs(proto.graph)
    return bool(ins) and all(dims(i) and not isinstance(dims(i)[0], int) for i in ins)
