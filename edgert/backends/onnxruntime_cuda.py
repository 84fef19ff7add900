"""ONNX Runtime's CUDA execution provider, on edgert's own CUDA buffers and stream.

The model reads and writes device buffers allocated through :mod:`edgert.backends.cuda`, bound once with
IOBinding (``bind_input(name, "cuda", 0, dtype, shape, ptr)``), and runs on the session's stream, handed
to ONNX Runtime as ``user_compute_stream``. Host-side ``inputs`` / ``outputs`` are page-locked arrays, and
the copies to and from them are asynchronous on the same stream. This is the GPU runtime for NVIDIA
machines without TensorRT, and the one the H200 device of this project runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from edgert._lazy import is_importable, lazy_import
from edgert.backends.base import Backend, BackendProbe, SessionOptions
from edgert.backends.gpu_session import GpuSession
from edgert.backends.onnxruntime import _spec, load_ort_session
from edgert.errors import BackendError, BackendUnavailable, first_line, reraise_as
from edgert.platform import gpu_present

__all__ = ["OnnxRuntimeCudaBackend", "OnnxRuntimeCudaSession"]

log = logging.getLogger(__name__)

_CUDA_EP = "CUDAExecutionProvider"


class OnnxRuntimeCudaSession(GpuSession):
    backend_name = "onnxruntime-cuda"
    sizes_cost_memory = True  # a session per part-batch size (_prepare_rows)

    def __init__(self, path: Path, options: SessionOptions) -> None:
        from edgert.backends.cuda import CudaDevice

        self._path = path
        self._options = options
        device = CudaDevice.get(options.device)
        # The session's stream exists before ONNX Runtime does: it is part of the provider options.
        with device.active():
            stream = device.stream()
        provider = (_CUDA_EP, {
            "device_id": str(options.device),
            "has_user_compute_stream": "1",
            "user_compute_stream": str(stream.handle),
        })
        if options.cuda_graph:
            # ONNX Runtime captures the run into a CUDA graph after a warm-up and replays it; needs every
            # node on the CUDA provider and fixed device addresses (IOBinding, as here).
            provider[1]["enable_cuda_graph"] = "1"
        # ORT 1.2x+ warns on stderr about plugin EP discovery for every CUDA session; errors still raise.
        lazy_import("onnxruntime").set_default_logger_severity(3)
        self._provider = provider
        with device.active():
            self._sess: Any = load_ort_session(path, [provider], options.threads)
        providers = self._sess.get_providers()
        if _CUDA_EP not in providers:
            raise BackendUnavailable(f"ONNX Runtime did not enable the CUDA provider (it has {providers}); "
                                     "check that onnxruntime-gpu matches this CUDA version")
        inputs = [_spec(a) for a in self._sess.get_inputs()]
        outputs = [_spec(a) for a in self._sess.get_outputs()]
        super().__init__(inputs, outputs, device, stream)
        self.metadata = dict(self._sess.get_modelmeta().custom_metadata_map or {})
        shapes = {s.name: s.concrete(dict(options.shapes)) for s in inputs}
        shapes.update(self._output_shapes(shapes))
        dtypes = {s.name: s.dtype for s in (*inputs, *outputs)}
        self._allocate(shapes, dtypes, {s.name for s in inputs})
        self._io = self._full_io = self._binding(self._sess, None)
        self._run = self._sess  # the ONNX Runtime session the next call runs (part batches: one per size)
        #: batch size -> (its own ONNX Runtime session, its binding on the first rows of the same buffers)
        self._parts: dict[int, tuple[Any, Any]] = {}

    def _binding(self, sess: Any, rows: int | None) -> Any:
        """An IOBinding of ``sess`` on this session's device buffers, at ``rows`` samples (None: the whole batch)."""
        io = sess.io_binding()
        device = self._options.device
        for name, host in self.inputs.items():
            shape = host.shape if rows is None else (rows, *host.shape[1:])
            io.bind_input(name, "cuda", device, host.dtype, shape, self.device_inputs[name].ptr)
        for name, host in self.outputs.items():
            shape = host.shape if rows is None else (rows, *host.shape[1:])
            io.bind_output(name, "cuda", device, host.dtype, shape, self.device_outputs[name].ptr)
        return io

    def smallest_batch(self) -> tuple[int | None, str]:
        if self._options.cuda_graph:
            return None, "a CUDA graph replays one batch size"
        fixed = [s.name for s in (*self.input_specs, *self.output_specs)
                 if not s.shape or (isinstance(s.shape[0], int) and s.shape[0] >= 0)]
        if fixed:
            return None, f"the model's batch is fixed ({fixed[0]}); edgert rebatch makes it dynamic"
        return 1, ""

    def _prepare_rows(self, sizes: tuple[int, ...]) -> None:
        """An ONNX Runtime session per smaller size, on this session's stream and buffers. Why not one session
        bound at several sizes: ONNX Runtime 1.31's CUDA provider tunes cuDNN again on every change of input
        shape, 0.4-0.9 s a call when sizes alternate (measured on the H200, docs/pipeline.md);
        a session that only ever sees one size tunes once, in the warm-up."""
        full = self.full_batch()
        with self.device.active():
            for size in sizes:
                if size != full and size not in self._parts:
                    sess = load_ort_session(self._path, [self._provider], self._options.threads)
                    self._parts[size] = (sess, self._binding(sess, size))

    def _set_rows(self, rows: int) -> None:
        if rows == self.full_batch():
            self._run, self._io = self._sess, self._full_io
        else:
            self._run, self._io = self._parts[rows]

    def fork(self) -> OnnxRuntimeCudaSession:
        """Another ONNX Runtime session on its own stream: the CUDA provider binds one stream per session."""
        return OnnxRuntimeCudaSession(self._path, self._options)

    def _output_shapes(self, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        if all(not s.is_dynamic for s in self.output_specs):
            return {s.name: s.concrete() for s in self.output_specs}
        # Output sizes follow the input sizes: one plain run on zeros tells them.
        import numpy as np

        feed = {s.name: np.zeros(input_shapes[s.name], s.dtype) for s in self.input_specs}
        with self.device.active(), reraise_as(BackendError, "ONNX Runtime failed"):
            values = self._sess.run(None, feed)
        return {s.name: tuple(v.shape) for s, v in zip(self.output_specs, values)}

    def _enqueue(self) -> None:
        try:
            self._run.run_with_iobinding(self._io)
        except Exception as exc:  # pybind11 exception types of onnxruntime
            first = first_line(exc)
            raise BackendError(f"ONNX Runtime (CUDA) failed: {first}. Note: outputs whose size changes with the "
                               "data need the onnxruntime (CPU) backend") from exc

    def _release_model(self) -> None:
        self._io = self._full_io = self._run = None
        self._parts.clear()
        self._sess = None


class OnnxRuntimeCudaBackend(Backend):
    name = "onnxruntime-cuda"
    gpu_sessions = True
    cuda_graphs = True  # the CUDA provider's enable_cuda_graph

    def probe(self) -> BackendProbe:
        present, why = gpu_present()
        if not present:
            return BackendProbe(self.name, False, f"no GPU: {why}")
        try:
            ort = lazy_import("onnxruntime")
        except BackendUnavailable as exc:
            return BackendProbe(self.name, False, str(exc))
        if _CUDA_EP not in ort.get_available_providers():
            return BackendProbe(self.name, False,
                                "onnxruntime has no CUDAExecutionProvider: pip install onnxruntime-gpu")
        if not is_importable("pycuda.driver"):
            return BackendProbe(self.name, False, "pycuda is not installed: pip install 'edgert[gpu]'")
        return BackendProbe(self.name, True, f"onnxruntime {ort.__version__} CUDA provider with pycuda buffers")

    def open(self, model: str | Path, options: SessionOptions | None = None) -> OnnxRuntimeCudaSession:
        return OnnxRuntimeCudaSession(self._onnx_path(model), options or SessionOptions())
