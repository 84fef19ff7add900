"""ONNX Runtime on the CPU: the backend that runs everywhere, and the accuracy reference.

Inputs and outputs are numpy buffers allocated at open and bound once through IOBinding, so a
steady-state ``infer()`` hands ONNX Runtime the same memory every call and allocates nothing in Python.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.backends.base import Backend, BackendProbe, Session, SessionOptions
from edgert.errors import BackendError, BackendUnavailable, ModelError, first_line, reraise_as
from edgert.types import TensorSpec

if TYPE_CHECKING:
    import onnx

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeSession", "cpu_session", "load_ort_session", "ort_dtype"]

log = logging.getLogger(__name__)

_ORT_TYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def ort_dtype(type_str: str) -> np.dtype:
    try:
        dtype: np.dtype = np.dtype(_ORT_TYPES[type_str])
        return dtype
    except KeyError:
        raise ModelError(f"tensor type {type_str} is not supported by edgert") from None


def _spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else (d if isinstance(d, str) and d else -1) for d in arg.shape)
    return TensorSpec(arg.name, shape, ort_dtype(arg.type))


def _session_options(ort: Any, threads: int, spin_wait: bool, optimize: bool = True) -> Any:
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if not spin_wait:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # ONNX Runtime prints its own [E:onnxruntime...] lines otherwise; its errors still raise, and edgert reports
    # them once, in one line.
    so.log_severity_level = 4
    return so


def load_ort_session(path: Path, providers: list[Any], threads: int = 0, spin_wait: bool = False) -> Any:
    """An ``InferenceSession`` with edgert's options; ONNX Runtime's errors become one-line ModelErrors."""
    ort = lazy_import("onnxruntime", "the ONNX Runtime backend")
    so = _session_options(ort, threads, spin_wait)
    try:
        return ort.InferenceSession(str(path), sess_options=so, providers=providers)
    except Exception as exc:  # onnxruntime raises pybind11 exception types that cannot be imported reliably
        first = first_line(exc)
        raise ModelError(f"{path}: ONNX Runtime cannot load this model: {first}") from exc


def cpu_session(model: onnx.ModelProto | Path, threads: int = 0, *, spin_wait: bool = False,
                optimize: bool = True, what: str = "edgert's own checks") -> Any:
    """An ONNX Runtime CPU session for edgert's own passes (calibration's collectors and probes, the rewrite
    checks, Whisper's decoder steps), on a model in memory or a file, with the backend's options.

    ``optimize=False`` keeps every named tensor (shape probes and tracing read intermediate outputs). ``spin_wait``
    lets ONNX Runtime's threads spin between nodes: faster for one busy session, but spinning threads take the
    cores other stages need. ONNX Runtime's errors raise as they are: the caller names what failed.
    """
    ort = lazy_import("onnxruntime", what)
    so = _session_options(ort, threads, spin_wait, optimize)
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, sess_options=so, providers=["CPUExecutionProvider"])


class OnnxRuntimeSession(Session):
    backend_name = "onnxruntime"

    def __init__(self, path: Path, options: SessionOptions, providers: list[Any] | None = None,
                 shared: Any = None) -> None:
        self._path = path
        self._options = options
        self._sess = shared if shared is not None else load_ort_session(
            path, providers or ["CPUExecutionProvider"], options.threads, options.spin_wait)
        super().__init__([_spec(a) for a in self._sess.get_inputs()], [_spec(a) for a in self._sess.get_outputs()])
        self.metadata = dict(self._sess.get_modelmeta().custom_metadata_map or {})
        for spec in self.input_specs:
            self.inputs[spec.name] = np.zeros(spec.concrete(dict(options.shapes)), dtype=spec.dtype)
        self._dynamic_outputs = False  # True: ONNX Runtime allocates outputs per call (sizes follow the data)
        self._allocate_outputs()
        self._io = self._sess.io_binding()
        # Passing our own RunOptions matters: without it each call builds a fresh one (~120 B of garbage).
        self._run_options = lazy_import("onnxruntime").RunOptions()
        for name, buf in self.inputs.items():
            self._io.bind_input(name, "cpu", 0, buf.dtype, buf.shape, buf.ctypes.data)
        self._bind_outputs()

    def fork(self) -> OnnxRuntimeSession:
        """A second binding with its own buffers on the same ``InferenceSession`` (no second copy of the model)."""
        if self._sess is None:
            raise BackendError("onnxruntime session is closed")
        return OnnxRuntimeSession(self._path, self._options, shared=self._sess)

    def _allocate_outputs(self) -> None:
        if all(not s.is_dynamic for s in self.output_specs):
            for spec in self.output_specs:
                self.outputs[spec.name] = np.zeros(spec.concrete(), dtype=spec.dtype)
            return
        # Output sizes depend on the input sizes: one run on the zeroed inputs tells them.
        try:
            results = self._run_plain()
        except BackendError as exc:
            # Some models cannot run on all-zero inputs (Silero VAD's If nodes reject sr=0): let ONNX
            # Runtime allocate the outputs per call instead of failing at open.
            log.info("cannot size the outputs with a probe run (%s); ONNX Runtime allocates them per call", exc)
            self._dynamic_outputs = True
            for spec in self.output_specs:
                self.outputs[spec.name] = np.zeros(spec.concrete(), dtype=spec.dtype)
            return
        for spec, value in zip(self.output_specs, results):
            self.outputs[spec.name] = np.zeros(value.shape, dtype=spec.dtype)

    def _bind_outputs(self) -> None:
        for name, buf in self.outputs.items():
            if self._dynamic_outputs:
                self._io.bind_output(name, "cpu")
            else:
                self._io.bind_output(name, "cpu", 0, buf.dtype, buf.shape, buf.ctypes.data)

    def _run_plain(self) -> list[np.ndarray]:
        with reraise_as(BackendError, "ONNX Runtime failed"):
            return list(self._sess.run(None, self.inputs))

    def _infer_impl(self) -> None:
        try:
            self._sess.run_with_iobinding(self._io, self._run_options)
        except Exception as exc:
            if self._dynamic_outputs:
                raise BackendError(f"ONNX Runtime failed: {first_line(exc)}") from exc
            # Outputs whose size depends on the data (NMS inside the graph) cannot use fixed buffers:
            # fall back to buffers ONNX Runtime allocates, copied out per call.
            log.info("outputs change size with the data; ONNX Runtime allocates them per call")
            self._dynamic_outputs = True
            self._io.clear_binding_outputs()
            for name in self.outputs:
                self._io.bind_output(name, "cpu")
            self._infer_impl()
            return
        if self._dynamic_outputs:
            for name, value in zip(self.outputs, self._io.copy_outputs_to_cpu()):
                self.outputs[name] = value

    def _close_impl(self) -> None:
        self._io = None
        self._sess = None


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def probe(self) -> BackendProbe:
        try:
            ort = lazy_import("onnxruntime")
        except BackendUnavailable as exc:
            return BackendProbe(self.name, False, str(exc))
        return BackendProbe(self.name, True, f"onnxruntime {ort.__version__} on the CPU")

    def open(self, model: str | Path, options: SessionOptions | None = None) -> OnnxRuntimeSession:
        return OnnxRuntimeSession(self._onnx_path(model), options or SessionOptions())
