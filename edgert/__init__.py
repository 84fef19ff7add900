"""edgert: deploy ONNX detectors and speech models on NVIDIA Jetson.

``import edgert`` needs numpy alone; every framework (onnxruntime, TensorRT, pycuda, OpenCV) is
imported by the module that wraps it, when it is used.

    import edgert
    found = edgert.Detector("yolov8n.onnx")("street.jpg")    # or a BGR array
    found.save("boxes.jpg")
    edgert.Pipeline(edgert.load_config("camera.yaml"), sinks=[edgert.CallbackSink(print)]).run()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgert.backends import Session, SessionOptions, get_backend, open_session
from edgert.config import PipelineConfig, load_config
from edgert.errors import EdgertError
from edgert.types import TensorSpec

if TYPE_CHECKING:
    from edgert.io.sinks import CallbackSink
    from edgert.pipeline import Pipeline
    from edgert.vision.detections import Detections
    from edgert.vision.detector import Detector

from edgert._version import __version__

# The quick path, imported on first use (PEP 562) so that ``import edgert`` stays this small.
_LAZY = {
    "CallbackSink": "edgert.io.sinks",
    "Detections": "edgert.vision.detections",
    "Detector": "edgert.vision.detector",
    "Pipeline": "edgert.pipeline",
    "demo_files": "edgert.demo_files",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgert' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])

__all__ = [
    "CallbackSink",
    "Detections",
    "Detector",
    "EdgertError",
    "Pipeline",
    "PipelineConfig",
    "Session",
    "SessionOptions",
    "TensorSpec",
    "__version__",
    "demo_files",
    "get_backend",
    "load_config",
    "open_session",
]
