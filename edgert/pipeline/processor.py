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
  session's device input, the model runs on device buffers, a confidence filter and NMS on the GPU send back
  only each frame's final boxes. GPU backends only (TensorRT, ONNX Runtime CUDA).

``runtime.processing: auto`` takes ``gpu`` whenever the backend runs on a GPU and CUDA works here.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgert.config import PipelineConfig
from edgert.vision.detections import Detections

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgert.pipeline.feeds import _Frame
    from edgert.pipeline.hooks import RunHooks
    from edgert.pipeline.parts import JSONDict, PipelineSource
    from edgert.pipeline.speech_result import SpeechResult
    from edgert.stats import PipelineStats

__all__ = [
    "MANY_SOURCES_BATCH",
    "TRIAL_SLOT_MAX_MS",
    "Processor",
    "ProcessorSlot",
    "default_slots",
    "keep_trial_slot",
    "slots_wanted",
]

log = logging.getLogger(__name__)


class ProcessorSlot(abc.ABC):
    """Up to ``batch`` frames at a time through one session (one engine call); used by one pipeline thread."""

    @abc.abstractmethod
    def process(self, frames: Sequence[np.ndarray], timings: Sequence[np.ndarray]) -> list[Detections]:
        """Detections of each of ``frames`` (at most the processor's ``batch``), in order; writes the seconds
        spent into each frame's ``timings`` at the preprocess/infer/postprocess positions of
        :data:`~edgert.stats.STAGES` (the engine call's time goes to every frame of the batch)."""

    def process_frames(self, frames: Sequence[_Frame]) -> Sequence[Detections]:
        """What the pipeline's slot thread calls with each batch: :meth:`process` on the frames' pixels and timings.
        A processor that needs more of a frame than its pixels overrides it (speech: each chunk's stream and times)."""
        return self.process([f.image() for f in frames], [f.timings for f in frames])

    def active(self) -> contextlib.AbstractContextManager[object]:
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

    def describe(self) -> JSONDict:
        """Facts for the summary's ``processor`` key."""
        return {"kind": self.kind, "slots": len(self.slots), "batch": self.batch}

    def stage_summary(self) -> dict[str, dict[str, float]] | None:
        """Per-stage device times (the GPU processor's ``gpu_ms``); None where there are none."""
        return None

    # Hooks the runner calls on every processor; the speech processor is the one that uses them.

    def attach_run(  # noqa: B027 - optional hook
            self, hooks: RunHooks | None, progress: Callable[[], None], sources: Sequence[PipelineSource],
            stats: PipelineStats) -> None:
        """Before warm-up: the run's hooks (the power budget), a progress callback for work inside one frame
        (systemd's watchdog), the opened sources and the statistics the metrics endpoint reads."""

    def drain(self) -> Sequence[tuple[int, SpeechResult]]:
        """After the last frame: results the processor still holds, as (source index, result) pairs."""
        return []

    def speech_summary(self) -> JSONDict | None:
        """The summary's ``speech`` section; None for a processor that runs no speech chain."""
        return None

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots = []

    def __enter__(self) -> Processor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: The batch from which the GPU processor tries a fourth batch in flight by default (:func:`default_slots`).
MANY_SOURCES_BATCH = 8
#: ... and keeps it only when one batch runs through the model faster than this (:func:`keep_trial_slot`).
TRIAL_SLOT_MAX_MS = 5.0


def default_slots(kind: str, batch: int = 1) -> int:
    """Frames (or batches) processed at once when ``runtime.slots`` is not set.

    CPU: two, on any machine with two cores or more. Each slot's session then runs single-threaded (on a
    larger machine, cores / 2 threads each), and two frames in flight keep every core busy through the
    serial parts of a network and through preprocessing and NMS. Measured on the 2-core CI box, nanodet:
    2 sessions x 1 thread 53.8 fps against 46.1 fps for one ``InferenceSession`` with ONNX Runtime's defaults.
    GPU: three (docs/gpu-pipeline.md: ORT's CUDA provider is bound by its launches on small models; two slots
    measured 0.89-1.17x compute-only FPS, three 1.12-1.58x), and from a batch of :data:`MANY_SOURCES_BATCH`
    four, the fourth on trial: :func:`keep_trial_slot` decides after the warm-up.
    """
    if kind == "gpu":
        return 4 if batch >= MANY_SOURCES_BATCH else 3
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def keep_trial_slot(model_ms: float | None) -> bool:
    """Whether the GPU processor keeps the fourth slot :func:`default_slots` gave a batch of many sources.

    A slot spends a batch's host work (staging each frame, cutting each frame's detections, waiting for the
    interpreter lock) with nothing of its own on the GPU; with many sources that work grows, and where the
    model's batch is short against it a fourth batch in flight keeps the GPU fed. Where the batch is long the
    GPU is already full with three, and a fourth only adds a batch of waiting to every frame's latency.
    Measured on the H200 (docs/pipeline.md): 16 nanodet streams (2.6 ms a batch alone)
    +9 % over three slots (three alternated bursts); 16 yolov8s streams (8.4-8.6 ms) +1 to +2 % for a p99 of 33
    against 25 ms.
    ``model_ms``: the fastest warm-up run of a slot's model, or None where the warm-up ran none (then the
    latency-safe three).
    """
    return model_ms is not None and model_ms < TRIAL_SLOT_MAX_MS


def slots_wanted(config: PipelineConfig, kind: str, batch: int = 1) -> int:
    """``runtime.slots``, or the processor's default for ``batch``."""
    return config.runtime.slots if config.runtime.slots is not None else default_slots(kind, batch)

