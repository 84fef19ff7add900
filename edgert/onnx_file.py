"""Reading an ONNX file: the one place that turns a missing or damaged model into a one-line ModelError.

``onnx`` is a core dependency but is imported here only when a model is read, so ``import edgert`` stays
numpy-only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edgert.errors import ModelError, first_line

if TYPE_CHECKING:
    import onnx

__all__ = ["QDQ_OPS", "foreign_model_error", "has_qdq", "read_onnx"]

#: The operators of an explicitly quantized (Q/DQ) model.
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})

#: Files people have where edgert needs an ONNX, and what they are (ONNX Runtime would say INVALID_PROTOBUF).
FOREIGN_MODELS = {
    ".pt": "a PyTorch checkpoint", ".pth": "a PyTorch checkpoint", ".torchscript": "a TorchScript model",
    ".tflite": "a TensorFlow Lite model", ".pb": "a TensorFlow graph", ".keras": "a Keras model",
    ".h5": "a Keras model", ".safetensors": "a weights file", ".ckpt": "a training checkpoint",
    ".engine": "a TensorRT engine", ".plan": "a TensorRT engine", ".trt": "a TensorRT engine",
}


def foreign_model_error(path: Path) -> ModelError | None:
    """A one-line error naming the export step when ``path`` is another framework's model, else None."""
    kind = FOREIGN_MODELS.get(path.suffix.lower())
    if kind is None:
        return None
    if kind == "a TensorRT engine":
        how = "run the .onnx it was built from (an Ultralytics engine: yolo export model=X.pt format=onnx)"
    elif path.suffix.lower() in (".pt", ".pth", ".torchscript"):
        how = (f"export it first: yolo export model={path.name} format=onnx (Ultralytics; "
               "other PyTorch models: torch.onnx.export)")
    else:
        how = "export it to ONNX first (e.g. tf2onnx for TensorFlow / TFLite)"
    return ModelError(f"{path}: {kind}; edgert needs an ONNX model here. Note: {how}")


def read_onnx(path: str | Path, weights: bool = True) -> onnx.ModelProto:
    """The model at ``path``; ``weights=False`` leaves external weight files unread (the interface only).

    Raises :class:`ModelError` ``PATH: model file not found`` or ``PATH: not a readable ONNX model (why)``.
    """
    import onnx

    p = Path(path)
    if not p.is_file():
        raise ModelError(f"{p}: model file not found")
    foreign = foreign_model_error(p)
    if foreign is not None:
        raise foreign
    try:
        return onnx.load(str(p), load_external_data=weights)
    except Exception as exc:  # protobuf raises DecodeError and friends for damaged files
        raise ModelError(f"{p}: not a readable ONNX model ({type(exc).__name__}: {first_line(exc)})") from exc


def has_qdq(graph: onnx.GraphProto) -> bool:
    """Whether ``graph`` (its top level) holds Q/DQ nodes: a model quantized already."""
    return any(n.op_type in QDQ_OPS for n in graph.node)
