"""The part every GPU session shares: pinned host buffers, device buffers, one stream, copy timing.

``session.inputs`` / ``session.outputs`` are page-locked numpy arrays allocated once at open. ``infer()``
copies inputs to the device asynchronously on the session's stream, enqueues the model on the same
stream, copies outputs back and synchronises once. With ``timing = True`` CUDA events around the three
steps fill ``last_timing`` (h2d_ms, compute_ms, d2h_ms) for ``edgert bench``; ``compute_only()`` runs
the model on whatever is on the device without copies (the compute-alone reference).
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from edgert.backends.base import Session
from edgert.backends.cuda import CudaDevice, DeviceBuffer, Event, Stream
from edgert.types import TensorSpec

__all__ = ["GpuSession"]


class GpuSession(Session):
    """A session whose model runs on a CUDA stream; subclasses implement :meth:`_enqueue`."""

    def __init__(self, input_specs: list[TensorSpec], output_specs: list[TensorSpec], device: CudaDevice,
                 stream: Stream | None = None) -> None:
        super().__init__(input_specs, output_specs)
        self.device = device
        self.device_inputs: dict[str, DeviceBuffer] = {}
        self.device_outputs: dict[str, DeviceBuffer] = {}
        self.timing = False
        self.last_timing: dict[str, float] | None = None
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
