"""The backend interface every engine runtime implements.

A :class:`Session` is one loaded model with its input and output buffers allocated once, at open.
``infer()`` is the one hot method: it reads the input buffers and fills the output buffers, and returns
the same output arrays every call. Callers that want zero copies write straight into
``session.inputs[name]`` (the preprocessing does); others pass arrays and the base class validates and
copies them in.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from edgert.errors import BackendError, InputError, ModelError
from edgert.onnx_file import foreign_model_error
from edgert.types import TensorSpec

__all__ = ["ENGINE_SUFFIXES", "Backend", "BackendProbe", "Session", "SessionOptions"]

#: What TensorRT engines are called (``edgert build -o``, trtexec, DeepStream).
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


@dataclass(frozen=True)
class SessionOptions:
    """What a caller may ask of any backend when opening a model."""

    threads: int = 0  # CPU threads for the backend's own pool; 0: its default
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # concrete shapes for dynamic inputs
    device: int = 0  # GPU ordinal where it applies
    cuda_graph: bool = False  # capture the model's launches once and replay them (backends that can)
    # Let the backend's CPU worker threads spin-wait between operators. Off: on a few shared cores (a Jetson,
    # a 2-core box) spinning burns the cycles that capture, preprocessing and NMS need. Measured on the 2-core
    # CI machine under load, nanodet with ORT's default threads: 13.1 fps spinning, 22.9 fps without.
    spin_wait: bool = False


@dataclass(frozen=True)
class BackendProbe:
    """Whether a backend can run on this machine, and why (shown by ``edgert info``)."""

    name: str
    available: bool
    reason: str


class Session(abc.ABC):
    """One loaded model. Use as a context manager; ``close()`` frees its buffers."""

    backend_name: str = "?"

    def __init__(self, input_specs: list[TensorSpec], output_specs: list[TensorSpec]) -> None:
        self.input_specs = input_specs
        self.output_specs = output_specs
        self.inputs: dict[str, np.ndarray] = {}  # host-visible input buffers, written by callers
        self.outputs: dict[str, np.ndarray] = {}  # host-visible output buffers, filled by infer()
        self.metadata: dict[str, str] = {}  # the model's metadata_props (Ultralytics: names, imgsz, stride)
        self._closed = False

    # -- the hot path -------------------------------------------------------------------------------
    def infer(self, feed: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run the model. ``feed`` (optional) is validated and copied into the input buffers."""
        if self._closed:
            raise InputError(f"{self.backend_name} session is closed")
        if feed:
            for name, array in feed.items():
                buf = self.inputs.get(name)
                if buf is None:
                    valid = ", ".join(self.inputs)
                    raise InputError(f"Input tensor: {name} | not an input of this model. Note: inputs are {valid}")
                spec = self._spec(name)
                spec.check(array)
                if array.shape != buf.shape:
                    raise InputError(
                        f"Input tensor: {name} | Received shape {array.shape}. "
                        f"Note: the session's buffer is {buf.shape}; reopen with shapes={{'{name}': ...}}"
                    )
                np.copyto(buf, array)
        self._infer_impl()
        return self.outputs

    @abc.abstractmethod
    def _infer_impl(self) -> None:
        """Run on ``self.inputs``, leave results in ``self.outputs``."""

    def fork(self) -> Session:
        """Another session on the same loaded model, with its own buffers (and stream, on a GPU).

        A pipeline processes several frames at once with one fork per slot: TensorRT gives each fork its
        own execution context of one deserialized engine, ONNX Runtime on the CPU shares one
        ``InferenceSession`` (its ``run`` is thread-safe) behind separate bindings.
        """
        raise BackendError(f"{self.backend_name} sessions cannot run several frames at once (no fork())")

    # -- lifetime -----------------------------------------------------------------------------------
    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_impl()

    def _close_impl(self) -> None:  # noqa: B027 - optional hook
        """Release backend resources; buffers are dropped by the base class."""

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------------------------
    def _spec(self, name: str) -> TensorSpec:
        for spec in self.input_specs:
            if spec.name == name:
                return spec
        raise InputError(f"no input named {name}")

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.backend_name,
            "inputs": [s.describe() for s in self.input_specs],
            "outputs": [s.describe() for s in self.output_specs],
        }


class Backend(abc.ABC):
    """A way to run models. Subclasses import their framework lazily, inside ``probe``/``open``."""

    name: str = "?"
    #: True: this backend runs engines that ``edgert build`` makes from ONNX (TensorRT): an ONNX model given to
    #: it is built first (by ``edgert build``, ``edgert bench``, the service's unit), and it is a ``--backend``
    #: of ``edgert build``.
    builds_engines: bool = False
    #: With ``builds_engines``: the Python module that builds (``tensorrt``), and whether it builds with no GPU
    #: present (TensorRT-RTX does, so ``edgert build --backend auto`` takes it on a CPU-only machine).
    build_module: str = ""
    builds_without_gpu: bool = False
    #: True: this backend's sessions are :class:`~edgert.backends.gpu_session.GpuSession` (buffers on a CUDA
    #: device, one stream), so the GPU processor can feed them.
    gpu_sessions: bool = False
    #: With ``gpu_sessions``: whether its sessions capture the model's launches as a CUDA graph
    #: (``runtime.cuda_graph``); a run that asks one that cannot is refused, not run without.
    cuda_graphs: bool = False

    @abc.abstractmethod
    def probe(self) -> BackendProbe:
        """Can this backend run here? Never raises."""

    @abc.abstractmethod
    def open(self, model: str | Path, options: SessionOptions | None = None) -> Session:
        """Load ``model`` and allocate its buffers."""

    def _onnx_path(self, model: str | Path) -> Path:
        """:meth:`_model_path` for a backend that runs ONNX only: a TensorRT engine is refused in one line
        (ONNX Runtime would say INVALID_PROTOBUF)."""
        path = self._model_path(model)
        if path.suffix.lower() in ENGINE_SUFFIXES:
            raise ModelError(f"{path}: a TensorRT engine; backend {self.name} runs ONNX models. Note: running an "
                             "engine needs TensorRT (--backend tensorrt, or tensorrt-rtx); here, run the .onnx "
                             "it was built from (Ultralytics: yolo export model=X.pt format=onnx)")
        return path

    @staticmethod
    def _model_path(model: str | Path, suffixes: tuple[str, ...] = (".onnx",)) -> Path:
        path = Path(model)
        if not path.exists():
            raise ModelError(f"{path}: model file not found")
        if not path.is_file():
            raise ModelError(f"{path}: not a file")
        foreign = foreign_model_error(path)
        if foreign is not None and path.suffix.lower() not in ENGINE_SUFFIXES:
            raise foreign
        return path
