"""TensorRT and TensorRT-RTX sessions: one module, parametrised by which Python module drives it.

Written against the name-based I/O API that TensorRT 8.5 through 10.x (and TensorRT-RTX) share:
``num_io_tensors`` / ``get_tensor_name`` / ``get_tensor_mode`` / ``get_tensor_shape`` / ``get_tensor_dtype``,
``set_input_shape`` for dynamic inputs, ``set_tensor_address`` once per buffer and ``execute_async_v3``
on the session's CUDA stream. Buffers are pinned host + device memory from :mod:`edgert.backends.cuda`,
allocated once. :meth:`TensorRTSession.fork` gives another execution context on the same engine, with
its own stream and buffers, so two frames can be in flight on two threads.

Engines are never built here: a session loads an engine file (plain plan or Ultralytics ``.engine``), or,
given an ``.onnx``, the engine ``edgert build`` left beside it. A foreign engine (other TensorRT version
or GPU, per its sidecar) raises :class:`~edgert.errors.EngineCacheError` naming the rebuild command.

Objects carry the ``tensorrt`` stub types (tensorrt-stubs), so mypy checks every call made on them.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from edgert._lazy import is_importable, lazy_import
from edgert.backends.base import Backend, BackendProbe, SessionOptions
from edgert.backends.gpu_session import GpuSession
from edgert.engine.file import file_sha256, read_engine_file
from edgert.engine.identity import GpuIdentity
from edgert.engine.sidecar import check_loadable, read_sidecar
from edgert.engine.trt_logger import make_logger
from edgert.errors import BackendError, BackendUnavailable, EngineCacheError, ModelError, NoMoreContexts
from edgert.platform import gpu_present
from edgert.types import TensorSpec

if TYPE_CHECKING:
    import tensorrt

    from edgert.backends.cuda import CudaDevice

__all__ = ["TensorRTBackend", "TensorRTRTXBackend", "TensorRTSession", "engine_for_onnx"]

log = logging.getLogger(__name__)


def engine_for_onnx(onnx: Path, backend: str) -> Path:
    """The engine ``edgert build`` made for ``onnx`` (``MODEL.engine`` beside it), checked against its sidecar."""

    engine = onnx.with_suffix(".engine")
    build = f"edgert build {onnx} --backend {backend}"
    if not engine.exists():
        raise EngineCacheError(f"{onnx}: no engine built yet (engines are never built while serving); run: {build}")
    record = read_sidecar(engine)
    if record is None or record.onnx_sha256 != file_sha256(onnx):
        raise EngineCacheError(f"{engine} was not built from this {onnx.name} (or has no sidecar); run: {build}")
    return engine


class _Engine:
    """One deserialized engine, shared by the execution contexts (sessions) forked from it."""

    def __init__(self, trt: ModuleType, backend: str, path: Path, device: CudaDevice) -> None:
        self.trt = trt
        self.backend = backend
        self.path = path
        self.device = device
        engine_file = read_engine_file(path)
        self.record = check_loadable(path, backend, str(trt.__version__),
                                     GpuIdentity(device.name, device.compute_capability))
        self.ultralytics = engine_file.metadata
        self.logger = make_logger(trt)
        with device.active():
            runtime: tensorrt.Runtime = trt.Runtime(self.logger)
            dla = engine_file.metadata.get("dla")
            if dla is not None:  # Ultralytics records the DLA core an engine was built for
                runtime.DLA_core = int(dla)
            with self.logger.capturing() as errors:
                engine: tensorrt.ICudaEngine | None = runtime.deserialize_cuda_engine(engine_file.plan)
        if engine is None:
            why = " ".join(errors[-1].split()) if errors else "no reason given"
            raise EngineCacheError(
                f"{path}: {backend} {trt.__version__} cannot load this engine ({why}). Note: an engine runs only "
                "with the TensorRT version and GPU it was built for; rebuild it with edgert build")
        self.runtime = runtime
        self.engine: tensorrt.ICudaEngine = engine
        self.lock = threading.Lock()
        self.users = 0

    def io(self) -> list[tuple[str, bool, tuple[int, ...], np.dtype]]:
        trt, engine = self.trt, self.engine
        out = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            shape = _dims(engine.get_tensor_shape(name))
            try:
                dtype = _np_dtype(engine.get_tensor_dtype(name))
            except TypeError as exc:
                raise ModelError(f"{self.path}: tensor {name} has type {engine.get_tensor_dtype(name)}, "
                                 "which numpy cannot hold") from exc
            out.append((name, is_input, shape, dtype))
        return out


class TensorRTSession(GpuSession):
    """One execution context of an engine, with its own stream and buffers."""

    def __init__(self, shared: _Engine, options: SessionOptions) -> None:
        self._shared = shared
        self.backend_name = shared.backend
        io = shared.io()
        specs_in = [TensorSpec(n, s, d) for n, is_in, s, d in io if is_in]
        specs_out = [TensorSpec(n, s, d) for n, is_in, s, d in io if not is_in]
        super().__init__(specs_in, specs_out, shared.device)
        self._options = options
        engine = shared.engine
        with self.device.active():
            ctx: tensorrt.IExecutionContext | None = engine.create_execution_context()
            if ctx is None:
                raise BackendError(f"{shared.path}: cannot create an execution context "
                                   f"({shared.logger.last_error() or 'out of GPU memory?'})")
            self.context: tensorrt.IExecutionContext = ctx
            self._profile = self._choose_profile(specs_in)
            shapes: dict[str, tuple[int, ...]] = {}
            for spec in specs_in:
                shape = self._input_shape(spec, options)
                if not self.context.set_input_shape(spec.name, shape):
                    raise BackendError(f"Input tensor: {spec.name} | shape {shape} is outside the engine's "
                                       f"optimization profile ({shared.logger.last_error()})")
                shapes[spec.name] = shape
            for spec in specs_out:
                shape = _dims(self.context.get_tensor_shape(spec.name))
                if any(d < 0 for d in shape):
                    raise BackendError(f"output {spec.name} changes size with the data; edgert's TensorRT session "
                                       "needs fixed output sizes (use the onnxruntime backend for this model)")
                shapes[spec.name] = shape
        self._allocate(shapes, {s.name: s.dtype for s in (*specs_in, *specs_out)}, {s.name for s in specs_in})
        with self.device.active():
            for name, buf in (*self.device_inputs.items(), *self.device_outputs.items()):
                self.context.set_tensor_address(name, buf.ptr)
        self.metadata = {str(k): v if isinstance(v, str) else _json(v) for k, v in shared.ultralytics.items()}
        with shared.lock:
            shared.users += 1

    def _choose_profile(self, specs_in: list[TensorSpec]) -> int:
        """The optimization profile this context runs with. The first context of an engine holds profile 0; on
        TensorRT 8.x a further context of a dynamic-shape engine starts with none and may take only a profile no
        other context holds (measured on 8.5.3: "Profile 0 has been chosen by another IExecutionContext"), so
        engines for several GPU slots are built with a profile per context (``edgert build --contexts``)."""
        active = int(self.context.active_optimization_profile)
        if active >= 0 or not any(spec.is_dynamic for spec in specs_in):
            return max(active, 0)
        engine, logger = self._shared.engine, self._shared.logger
        with logger.capturing():
            for k in range(engine.num_optimization_profiles):
                if self.context.set_optimization_profile_async(k, self.stream.handle):
                    self.stream.synchronize()
                    return k
        del self.context
        raise NoMoreContexts(f"{self._shared.path}: all {engine.num_optimization_profiles} optimization profile(s) of "
                             "this engine are held by other execution contexts (one per context on TensorRT 8.x); "
                             "rebuild with edgert build --contexts N for N GPU slots")

    def _input_shape(self, spec: TensorSpec, options: SessionOptions) -> tuple[int, ...]:
        if spec.name in options.shapes:
            return spec.concrete(dict(options.shapes))
        if not spec.is_dynamic:
            return spec.concrete()
        # A dynamic input without a requested shape runs at the profile's OPT shape, what it was tuned for.
        _lo, opt, _hi = self._shared.engine.get_tensor_profile_shape(spec.name, self._profile)
        return _dims(opt)

    def smallest_batch(self) -> tuple[int | None, str]:
        """The largest of the inputs' profile minimums on the batch axis: every input runs at it. An input fixed
        on that axis, or a profile that starts at the whole batch, allows none (``edgert build --shapes``
        NAME:1x.../OPTx.../MAXx... makes an engine that does)."""
        engine = self._shared.engine
        smallest = 1
        for spec in self.input_specs:
            if not spec.shape or (isinstance(spec.shape[0], int) and spec.shape[0] >= 0):
                return None, f"the engine's input {spec.name} has a fixed batch"
            lo, _opt, _hi = engine.get_tensor_profile_shape(spec.name, self._profile)
            smallest = max(smallest, int(lo[0]))
        full = self.full_batch() or smallest
        if smallest >= full:
            return None, f"the engine's optimization profile starts at batch {smallest}"
        return smallest, ""

    def _set_rows(self, rows: int) -> None:
        for name, host in self.inputs.items():
            if not self.context.set_input_shape(name, (rows, *host.shape[1:])):
                raise BackendError(f"{self.backend_name}: batch {rows} is outside the engine's optimization profile "
                                   f"({self._shared.logger.last_error() or 'no reason given'})")

    def layer_information(self) -> str:
        """The engine inspector's JSON of every layer (precision, formats and tactic where the engine was built
        with ``edgert build --detailed-layers``; names only otherwise): :func:`edgert.engine.layers.summarize_layers`
        reads it."""
        trt = self._shared.trt
        with self.device.active():
            inspector = self._shared.engine.create_engine_inspector()
            inspector.execution_context = self.context
            return str(inspector.get_engine_information(trt.LayerInformationFormat.JSON))

    def fork(self) -> TensorRTSession:
        """Another execution context on the same engine (own stream and buffers): a second frame in flight."""
        return TensorRTSession(self._shared, self._options)

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.stream.handle):
            raise BackendError(f"{self.backend_name} failed to run: {self._shared.logger.last_error() or 'no reason'}")

    def _release_model(self) -> None:
        del self.context
        with self._shared.lock:
            self._shared.users -= 1


#: TensorRT data types by name -> numpy. Not ``trt.nptype``: TensorRT 8.5's maps BOOL to ``np.bool``, which numpy
#: 1.24 removed, so it raises for every type on a current numpy.
_NP_DTYPES = {"FLOAT": "float32", "HALF": "float16", "INT8": "int8", "INT32": "int32", "INT64": "int64",
              "BOOL": "bool", "UINT8": "uint8", "FP8": "uint8"}


def _np_dtype(dtype: Any) -> np.dtype:
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in _NP_DTYPES:
        raise TypeError(f"no numpy type for TensorRT's {name}")
    return np.dtype(_NP_DTYPES[name])


def _dims(dims: tensorrt.Dims | Any) -> tuple[int, ...]:
    return tuple(int(dims[i]) for i in range(len(dims)))


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


class _TensorRTFamily(Backend):
    module = "tensorrt"
    gpu_sessions = True

    def _trt(self) -> ModuleType:
        return lazy_import(self.module, f"the {self.name} backend")

    def probe(self) -> BackendProbe:
        try:
            trt = self._trt()
        except BackendUnavailable as exc:
            return BackendProbe(self.name, False, str(exc))
        present, why = gpu_present()
        if not present:
            extra = " (it still builds engines here: edgert build --backend tensorrt-rtx)" if self.module == \
                "tensorrt_rtx" else ""
            return BackendProbe(self.name, False, f"{self.module} {trt.__version__} installed but no GPU: {why}{extra}")
        if not is_importable("pycuda.driver"):
            return BackendProbe(self.name, False, "pycuda is not installed: pip install 'edgert[gpu]'")
        return BackendProbe(self.name, True, f"{self.module} {trt.__version__}")

    def open(self, model: str | Path, options: SessionOptions | None = None) -> TensorRTSession:
        from edgert.backends.cuda import CudaDevice

        options = options or SessionOptions()
        path = self._model_path(model)
        if path.suffix.lower() == ".onnx":
            path = engine_for_onnx(path, self.name)
        trt = self._trt()
        # The sidecar says which TensorRT built the engine: a foreign one fails here, before CUDA starts.
        check_loadable(path, self.name, str(trt.__version__), None)
        device = CudaDevice.get(options.device)
        return TensorRTSession(_Engine(trt, self.name, path, device), options)


class TensorRTBackend(_TensorRTFamily):
    name = "tensorrt"
    module = "tensorrt"
    builds_engines = True
    build_module = "tensorrt"


class TensorRTRTXBackend(_TensorRTFamily):
    name = "tensorrt-rtx"
    module = "tensorrt_rtx"
    builds_engines = True
    build_module = "tensorrt_rtx"
    builds_without_gpu = True
