"""The part every GPU session shares: pinned host buffers, device buffers, one stream, copy timing.

``session.inputs`` / ``session.outputs`` are page-locked numpy arrays allocated once at open. ``infer()``
copies inputs to the device asynchronously on the session's stream, enqueues the model on the same
stream, copies outputs back and synchronises once. With ``timing = True`` CUDA events around the three
steps fill ``last_timing`` (h2d_ms, compute_ms, d2h_ms) for ``edgert bench``; ``compute_only()`` runs
the model on whatever is on the device without copies (the compute-alone reference).

Part batches: the buffers hold the batch the session was opened for, and a model whose batch is dynamic can
also run on their first rows. :meth:`GpuSession.allow_part_batches` picks the sizes (:func:`batch_sizes`: 1, 2,
4, ... and the whole batch) and :meth:`GpuSession.use_rows` runs the next calls at the smallest that holds the
rows, so a batch of 3 frames costs what 4 do, not what 16 do (measured on the H100: YOLOv8s at batch 1 in a
batch-16 engine 1.9 ms against 9.4 ms for 16; docs/pipeline.md). Sizes are powers of two
because each size costs a warm-up run and, on ONNX Runtime, a session of its own (its CUDA provider tunes cuDNN
again whenever one session's input shape changes: :meth:`OnnxRuntimeCudaSession._prepare_rows`).
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from edgert.backends.base import Session
from edgert.backends.cuda import CudaDevice, DeviceBuffer, Event, Stream
from edgert.types import TensorSpec

__all__ = ["GpuSession", "batch_sizes"]


def batch_sizes(full: int, smallest: int = 1) -> tuple[int, ...]:
    """The sizes a session with a ``full``-frame batch runs at: the powers of two from ``smallest`` up, then
    ``full`` (``(full,)`` when ``smallest`` is ``full``)."""
    sizes = []
    size = 1
    while size < full:
        if size >= smallest:
            sizes.append(size)
        size *= 2
    return (*sizes, full)


class GpuSession(Session):
    """A session whose model runs on a CUDA stream; subclasses implement :meth:`_enqueue` and :meth:`_set_rows`."""

    #: whether each part-batch size holds memory of its own (ONNX Runtime: a session per size; TensorRT: none)
    sizes_cost_memory = False

    def __init__(self, input_specs: list[TensorSpec], output_specs: list[TensorSpec], device: CudaDevice,
                 stream: Stream | None = None) -> None:
        super().__init__(input_specs, output_specs)
        self.device = device
        self.device_inputs: dict[str, DeviceBuffer] = {}
        self.device_outputs: dict[str, DeviceBuffer] = {}
        self.timing = False
        self.last_timing: dict[str, float] | None = None
        #: the batch sizes the model runs at (:meth:`allow_part_batches`); empty until buffers exist
        self.batch_sizes: tuple[int, ...] = ()
        self._rows = 0  # the batch size the next call runs at
        with device.active():
            self.stream: Stream = stream or device.stream()
            self._events: list[Event] = [device.event() for _ in range(4)]

    # -- allocation --------------------------------------------------------------------------------
    def _allocate(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any], inputs: set[str]) -> None:
        """Pinned host + device buffers for every tensor, once."""
        with self.device.active():
            for name, shape in shapes.items():
                host = self.device.pinned_empty(shape, dtypes[name])
                host.fill(0)
                dev = self.device.alloc(host.nbytes)
                if name in inputs:
                    self.inputs[name] = host
                    self.device_inputs[name] = dev
                else:
                    self.outputs[name] = host
                    self.device_outputs[name] = dev
            # Zeroed device inputs: compute_only() before any infer() reads defined memory.
            for name, dev in self.device_inputs.items():
                dev.copy_from_host_async(self.inputs[name], self.stream)
            self.stream.synchronize()
        self._rows = self.full_batch() or 0  # every call at the whole batch until part batches are allowed

    # -- part batches ------------------------------------------------------------------------------
    def full_batch(self) -> int | None:
        """The batch every buffer was allocated for (the first dimension they all share), or None."""
        leads = {int(a.shape[0]) for a in (*self.inputs.values(), *self.outputs.values()) if a.ndim}
        return leads.pop() if len(leads) == 1 and len(self.inputs) else None

    def smallest_batch(self) -> tuple[int | None, str]:
        """(the smallest batch this model runs at on these buffers, or None; why not) for the backend to say:
        the base class knows of none."""
        return None, f"{self.backend_name} runs one batch size"

    def allow_part_batches(self) -> tuple[tuple[int, ...], str]:
        """Let :meth:`use_rows` run part batches where the model can; (the sizes, why only the full one)."""
        full = self.full_batch()
        if full is None:
            return (), "the buffers share no batch dimension"
        smallest, why = self.smallest_batch() if full > 1 else (full, "")
        sizes = batch_sizes(full, smallest) if smallest is not None else (full,)
        if len(sizes) > 1:
            self._prepare_rows(sizes)
        self.batch_sizes = sizes
        self._rows = full
        return sizes, why if smallest is None else ""

    def use_rows(self, rows: int) -> int:
        """Run the next calls on the first ``rows`` samples' worth of the buffers at the smallest allowed batch
        size that holds them (the rows past ``rows`` are computed and not read); that size."""
        for size in self.batch_sizes:
            if size >= rows:
                if size != self._rows:
                    with self.device.active():
                        self._set_rows(size)
                    self._rows = size
                return size
        return self._rows or rows

    def _prepare_rows(self, sizes: tuple[int, ...]) -> None:
        """Whatever running at ``sizes`` needs before the first call (a backend that keeps a session per size)."""

    @abc.abstractmethod
    def _set_rows(self, rows: int) -> None:
        """Make the next :meth:`_enqueue` run at batch ``rows`` (only sizes :meth:`smallest_batch` allowed)."""

    # -- the hot path ------------------------------------------------------------------------------
    @abc.abstractmethod
    def _enqueue(self) -> None:
        """Run the model on ``self.stream`` reading ``device_inputs``, writing ``device_outputs``."""

    def _infer_impl(self) -> None:
        s, ev = self.stream, self._events
        with self.device.active():
            if self.timing:
                ev[0].record(s)
            for name, host in self.inputs.items():
                self.device_inputs[name].copy_from_host_async(host, s)
            if self.timing:
                ev[1].record(s)
            self._enqueue()
            if self.timing:
                ev[2].record(s)
            for name, host in self.outputs.items():
                self.device_outputs[name].copy_to_host_async(host, s)
            if self.timing:
                ev[3].record(s)
            s.synchronize()
            if self.timing:
                self.last_timing = {
                    "h2d_ms": ev[1].elapsed_ms(ev[0]),
                    "compute_ms": ev[2].elapsed_ms(ev[1]),
                    "d2h_ms": ev[3].elapsed_ms(ev[2]),
                }

    def compute_only(self) -> None:
        """Run the model once on the data already on the device, no copies; returns when it is done."""
        with self.device.active():
            self._enqueue()
            self.stream.synchronize()

    def compute_async(self) -> None:
        """:meth:`compute_only` without the wait: the model is queued on ``self.stream`` and the caller queues
        what follows it on the same stream and synchronises once (the GPU slot: one wait per batch)."""
        with self.device.active():
            self._enqueue_async()

    def _enqueue_async(self) -> None:
        """:meth:`_enqueue`, returning as soon as the work is queued (a backend that waits inside overrides it)."""
        self._enqueue()

    # -- lifetime ----------------------------------------------------------------------------------
    def _release_model(self) -> None:
        """Drop framework objects (engine, context, ORT session) before the memory they point into."""

    def _close_impl(self) -> None:
        with self.device.active():
            self.stream.synchronize()
            self._release_model()
            for buf in (*self.device_inputs.values(), *self.device_outputs.values()):
                buf.free()
            self.device_inputs.clear()
            self.device_outputs.clear()
            # Page-locked memory is freed when the arrays go; drop them while the context is current.
            self.inputs = {name: np.empty(0) for name in self.inputs}
            self.outputs = {name: np.empty(0) for name in self.outputs}
            self._events = []
            self.stream.raw = None  # pycuda objects must die with the context current, not at exit
