"""edgert: deploy ONNX detectors and speech models on NVIDIA Jetson.

``import edgert`` needs numpy alone; every framework (onnxruntime, TensorRT, pycuda, OpenCV) is
imported by the module that wraps it, when it is used.
"""

from __future__ import annotations

from edgert.backends import Session, SessionOptions, get_backend, open_session
from edgert.config import PipelineConfig, load_config
from edgert.errors import EdgertError
from edgert.types import TensorSpec

__version__ = "0.1.0"

__all__ = [
    "EdgertError",
    "PipelineConfig",
    "Session",
    "SessionOptions",
    "TensorSpec",
    "__version__",
    "get_backend",
    "load_config",
    "open_session",
]
