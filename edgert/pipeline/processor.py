"""Processors: the part of the one pipeline that turns admitted frames into detections.

The :class:`~edgert.pipeline.runner.Pipeline` owns everything around the model (admission, the power
budget, signals, observers, sinks, statistics, the summary). A *processor* owns the model side: a few
*slots*, each able to take one frame from BGR pixels to :class:`~edgert.vision.detections.Detections` on its
own session (a fork of one loaded model: an execution context of one TensorRT engine, a binding on one ONNX
Runtime session, or on the GPU a session with its own CUDA stream). The pipeline runs one thread per slot;
each thread takes the next admitted frame, so with two or more slots the preprocessing and decoding of one
frame overlap the inference of another, and the pipeline puts the results back in frame order.

Two processors exist, and every pipeline feature works with either:

- ``cpu`` (:mod:`edgert.pipeline.cpu`): host letterbox into the session's input buffer, ``session.infer``,
  host decode + NMS. Any backend.
- ``gpu`` (:mod:`edgert.pipeline.gpu`): the frame goes to the GPU once, the letterbox kernel writes the
  session's device input, the model runs on device buffers, a confidence filter on the GPU sends back only
  the candidate rows, NMS on the host. GPU backends only (TensorRT, ONNX Runtime CUDA).

``runtime.processing: auto`` takes ``gpu`` whenever the backend runs on a GPU and CUDA works here.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import ConfigError
from edgert.vision.detections import Detections

__all__ = [
    "GPU_ONLY_KEYS",
    "Processor",
    "ProcessorSlot",
    "batched_model",
    "default_slots",
    "resolve_processing",
    "slots_wanted",
]

log = logging.getLogger(__name__)

#: runtime keys that only the GPU processor reads, with the flag that sets each.
GPU_ONLY_KEYS: dict[str, str] = {"memory": "--memory", "cuda_graph": "--cuda-graph"}


class ProcessorSlot(abc.ABC):
    """Up to ``batch`` frames at a time through one session (one engine call); used by one pipeline thread."""

    @abc.abstractmethod
    def process(self, frames: Sequence[np.ndarray], timings: Sequence[np.ndarray]) -> list[Detections]:
        """Detections of each of ``frames`` (at most the processor's ``batch``), in order; writes the seconds
        spent into each frame's ``timings`` at the preprocess/infer/postprocess positions of
        :data:`~edgert.pipeline.stats.STAGES` (the engine call's time goes to every frame of the batch)."""

    def active(self) -> contextlib.AbstractContextManager[Any]:
        """The context the slot's thread runs in (the CUDA context push on the GPU)."""
        return contextlib.nullcontext()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the slot owns."""


class Processor(abc.ABC):
    """A model opened for the pipeline: class names, input facts and the slots."""

    kind: str = "?"

    def __init__(self) -> None:
        self.slots: list[ProcessorSlot] = []
        self.names: tuple[str, ...] = ()
        self.backend_name = "?"
        self.input_name = ""
        self.input_shape: tuple[int, ...] = ()
        self.input_dtype = "float32"
        self.batch = 1  # frames per engine call
        self.batch_note: str | None = None  # why the batch is smaller than asked for, if it is

    def prepare(self, slot: ProcessorSlot) -> None:  # noqa: B027 - optional hook
        """Called once on each slot's own thread before its first frame (the GPU captures CUDA graphs here)."""

    @abc.abstractmethod
    def warm_up(self, runs: int) -> None:
        """Run each slot's model ``runs`` times, so first-call costs (allocator growth, autotuning) are not frames."""

    def frame_buffer(self, height: int, width: int) -> np.ndarray | None:
        """A buffer for the source to decode frames of this size into, or None: any numpy array will do.

        The GPU processor hands out page-locked (on Jetson: mapped) memory, so a decoded frame goes to the
        GPU without a host copy, or is read by the kernel where it lies. The pipeline allocates one per
        frame in flight, once, and lets go of them before it closes the processor.
        """
        return None

    def describe(self) -> dict[str, Any]:
        """Facts for the summary's ``processor`` key."""
        return {"kind": self.kind, "slots": len(self.slots), "batch": self.batch}

    def stage_summary(self) -> dict[str, dict[str, float]] | None:
        """Per-stage device times (the GPU processor's ``gpu_ms``); None where there are none."""
        return None

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots = []

    def __enter__(self) -> Processor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def default_slots(kind: str) -> int:
    """Frames processed at once when ``runtime.slots`` is not set.

    CPU: two, on any machine with two cores or more. Each slot's session then runs single-threaded (on a
    larger machine, cores / 2 threads each), and two frames in flight keep every core busy through the
    serial parts of a network and through preprocessing and NMS. Measured on the 2-core CI box, nanodet:
    2 sessions x 1 thread 53.8 fps against 46.1 fps for one ``InferenceSession`` with ONNX Runtime's defaults.
    GPU: three (docs/gpu-pipeline.md: ORT's CUDA provider is bound by its launches on small models; two slots
    measured 0.89-1.17x compute-only FPS, three 1.12-1.58x).
    """
    if kind == "gpu":
        return 3
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def _gpu_usable(backend: str) -> tuple[bool, str]:
    from edgert.backends import get_backend, gpu_backends

    if backend not in gpu_backends():
        return False, f"backend {backend} runs on the CPU (GPU processing needs one of {', '.join(gpu_backends())})"

    try:
        get_backend(backend)
    except ConfigError:
        raise
    except Exception as exc:  # BackendUnavailable and friends: say why, in one line
        return False, str(exc)
    from edgert.backends.cuda import check_available

    try:
        check_available()
    except Exception as exc:
        return False, str(exc)
    return True, f"backend {backend} runs on the GPU"


def resolve_processing(config: PipelineConfig) -> tuple[str, str, str]:
    """(backend, processing, why) for ``config``: the backend ``auto`` picks, and ``cpu`` or ``gpu``.

    Raises :class:`ConfigError` for ``processing: gpu`` where no GPU can be used, and for GPU-only keys
    (``runtime.memory``, ``runtime.cuda_graph``) on a run that uses the CPU processor.
    """
    from edgert.backends import choose_backend, gpu_backends

    backend = config.model.backend
    probes_note = ""
    if backend == "auto":
        backend, probes = choose_backend()
        passed = [f"{p.name}: {p.reason}" for p in probes if not p.available and p.name in gpu_backends()]
        probes_note = f" ({'; '.join(passed)})" if passed else ""
    requested = config.runtime.processing
    if requested == "cpu":
        processing, why = "cpu", "runtime.processing: cpu"
    else:
        ok, why = _gpu_usable(backend)
        if requested == "gpu" and not ok:
            raise ConfigError(f"runtime.processing: gpu: no usable GPU: {why}{probes_note}")
        processing = "gpu" if ok else "cpu"
    if processing == "cpu":
        for key, flag in GPU_ONLY_KEYS.items():
            if getattr(config.runtime, key) is not None:
                raise ConfigError(f"runtime.{key} ({flag}) applies to GPU processing only; this run uses the CPU "
                                  f"processor: {why}. Note: drop it, or set runtime.processing: gpu")
    return backend, processing, why


def batched_model(path: str, batch: int) -> tuple[str, int, str | None]:
    """(model path, batch, note): the model to open for ``batch`` frames per call.

    A model with a dynamic batch dimension (or an engine, whose optimisation profile decides) is used as it
    is; an ONNX model fixed at batch 1 is rewritten (checked, cached: :mod:`edgert.rewrite.batch`) or, where
    that cannot be done, runs at batch 1 and the note says why.
    """
    if batch <= 1 or not path.lower().endswith(".onnx"):
        return path, batch, None
    from edgert.onnx_file import read_onnx

    graph = read_onnx(path, weights=False).graph
    initializers = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    dims = [i.type.tensor_type.shape.dim for i in inputs]
    if all(d and (d[0].dim_param or d[0].dim_value <= 0) for d in dims):
        return path, batch, None  # already dynamic
    if all(d and d[0].dim_value == batch for d in dims):
        return path, batch, None
    from edgert.errors import ModelError
    from edgert.rewrite.batch import batched_model_path

    try:
        return str(batched_model_path(path)), batch, None
    except ModelError as exc:
        note = f"{exc}; sources run in rotation without batching"
        log.warning("%s", note)
        return path, 1, note


def slots_wanted(config: PipelineConfig, kind: str) -> int:
    """``runtime.slots``, or the processor's default."""
    return config.runtime.slots if config.runtime.slots is not None else default_slots(kind)

