"""Import optional packages only where they are used, with an error that says what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from edgert.errors import BackendUnavailable

#: module name -> how a user gets it. JetPack's TensorRT and OpenCV come from apt, not pip.
INSTALL_HINTS: dict[str, str] = {
    "onnxruntime": "pip install 'edgert[cpu]' (or onnxruntime-gpu for the CUDA provider)",
    "cv2": "pip install 'edgert[opencv]' (on a Jetson use JetPack's OpenCV: python3-opencv, for GStreamer)",
    "pycuda": "pip install 'edgert[gpu]'",
    "pynvml": "pip install nvidia-ml-py",
    "tensorrt": "JetPack: apt install python3-libnvinfer; desktop: pip install tensorrt",
    "tensorrt_rtx": "pip install 'edgert[rtx]'",
    "tokenizers": "pip install 'edgert[speech]'",
    "soundfile": "pip install 'edgert[speech]'",
    "sounddevice": "pip install sounddevice",
    "psutil": "pip install psutil",
    "pycocotools": "pip install 'edgert[val]'",
    # SORT and OC-SORT only (ByteTrack is edgert's own); not an extra: it brings opencv-python and numpy 2.
    "trackers": "pip install trackers (Python 3.10+, numpy 2; not on JetPack: use tracker: bytetrack)",
    "supervision": "pip install trackers (Python 3.10+, numpy 2; not on JetPack: use tracker: bytetrack)",
    "scipy": "pip install 'edgert[track]'",
    "whisper_normalizer": "pip install whisper-normalizer (Python 3.9+), or --normalizer basic",
    "paho": "pip install 'edgert[mqtt]'",
    "onnxconverter_common": "pip install 'edgert[fp16]'",
}


def lazy_import(name: str, purpose: str = "") -> ModuleType:
    """Import ``name`` or raise :class:`BackendUnavailable` naming the install step."""
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        hint = INSTALL_HINTS.get(name.split(".")[0], f"pip install {name}")
        what = f" ({purpose})" if purpose else ""
        raise BackendUnavailable(f"{name} is not installed{what}: {hint}. ({exc})") from None
    # A stub-only package (tensorrt-stubs ships a bare `tensorrt/` folder of .pyi files) imports as an
    # empty namespace package; treat it as missing.
    if getattr(module, "__file__", None) is None and not hasattr(module, "__version__"):
        hint = INSTALL_HINTS.get(name.split(".")[0], f"pip install {name}")
        raise BackendUnavailable(f"{name} is only present as type stubs: {hint}")
    return module


def is_importable(name: str) -> bool:
    try:
        lazy_import(name)
    except BackendUnavailable:
        return False
    return True
