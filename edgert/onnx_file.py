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

__all__ = ["read_onnx"]


def read_onnx(path: str | Path, weights: bool = True) -> onnx.ModelProto:
    """The model at ``path``; ``weights=False`` leaves external weight files unread (the interface only).

    Raises :class:`ModelError` ``PATH: model file not found`` or ``PATH: not a readable ONNX model (why)``.
    """
    import onnx

    p = Path(path)
    if not p.is_file():
        raise ModelError(f"{p}: model file not found")
    try:
        return onnx.load(str(p), load_external_data=weights)
    except Exception as exc:  # protobuf raises DecodeError and friends for damaged files
        raise ModelError(f"{p}: not a readable ONNX model ({type(exc).__name__}: {first_line(exc)})") from exc
