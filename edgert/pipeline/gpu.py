"""The GPU detection pipeline: preprocessing and the confidence filter on the GPU, several slots in flight.

A *slot* is one GPU session (ONNX Runtime CUDA with IOBinding, or a TensorRT context) with its own
CUDA stream, its own device input/output buffers, a frame staging buffer and a candidate buffer. Each
slot is driven by its own worker thread, which for every frame it takes:

1. copies the decoded BGR frame into the slot's page-locked staging buffer (host memcpy);
2. ``pinned``: uploads it with one async copy; ``zero-copy``: nothing, the kernel reads the mapped
   staging buffer through its device address (on Jetson that is the same DRAM);
3. runs the letterbox kernel into the session's device input buffer;
4. runs the model on the device buffers (``session.compute_only()``: IOBinding, no host copies);
5. runs the confidence filter into the candidate buffer and copies the few rows back;
6. synchronises the stream, then NMS and the mapping to the frame on the CPU.

ONNX Runtime releases the GIL while it runs, so with two or more slots the upload and preprocessing of
frame N+1 run while frame N infers, and the readback and NMS of N-1 overlap both. CUDA events around each
step give per-stage GPU times (``upload``, ``preprocess``, ``infer``, ``decode``).

Memory: :func:`choose_memory_mode` picks zero-copy (mapped page-locked memory) on integrated GPUs that
can map host memory, pinned copies on discrete GPUs; both can be asked for. On a discrete GPU zero-copy
reads the frame over PCIe, once per output pixel's taps: it works, and it is slower.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import BackendError, ConfigError, InputError, ModelError
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.detections import Detections
from edgert.vision.detector import concrete_output_specs, image_input
from edgert.vision.gpu_decode import GPU_DECODE_KINDS, GpuCandidateFilter, candidates_to_detections
from edgert.vision.gpu_preprocess import GpuLetterbox, LetterboxPlan
from edgert.vision.preprocess import LetterboxTransform, Preprocessor

__all__ = [
    "GPU_STAGES",
    "MEMORY_MODES",
    "GpuPipeline",
    "GpuPipelineOptions",
    "choose_memory_mode",
    "ordered_parallel",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
W = TypeVar("W")
R = TypeVar("R")

MEMORY_MODES = ("auto", "pinned", "zero-copy")
#: ONNX Runtime captures after 2 regular runs (min_num_runs_before_cuda_graph_capture_); 3 runs cover it.
_GRAPH_CAPTURE_RUNS = 3
_GRAPH_WAIT_S = 300.0
GPU_STAGES = ("upload", "preprocess", "infer", "decode")


def choose_memory_mode(requested: str, integrated: bool, can_map: bool) -> str:
    """``"zero-copy"`` or ``"pinned"`` for a device with these traits.

    ``auto``: zero-copy when the GPU is integrated (shares DRAM with the CPU: Jetson) and can map host
    memory, otherwise pinned copies (a discrete GPU would read mapped memory over PCIe). Asking for
    zero-copy on a device that cannot map host memory is a :class:`ConfigError`.
    """
    if requested not in MEMORY_MODES:
        raise ConfigError(f"memory mode {requested!r} is not one of {', '.join(MEMORY_MODES)}")
    if requested == "pinned":
        return "pinned"
    if requested == "zero-copy":
        if not can_map:
            raise ConfigError("this GPU cannot map host memory (CAN_MAP_HOST_MEMORY is 0). Note: use --memory pinned")
        return "zero-copy"
    return "zero-copy" if integrated and can_map else "pinned"


@dataclass(frozen=True)
class GpuPipelineOptions:
    """How the GPU pipeline runs (see the module doc)."""

    memory: Literal["auto", "pinned", "zero-copy"] = "auto"
    # Sessions in flight, each with its own stream, buffers and thread. 3, not 2: ORT's CUDA provider is bound by
    # its CPU-side launches on small models, and on the H200 two slots measured 0.89-1.17x compute-only FPS
    # across machines while three measured 1.12-1.58x (docs/gpu-pipeline.md).
    slots: int = 3
    gpu_decode: bool = True  # confidence filter on the GPU (yolov8 / yolov5 float32 outputs)
    candidates: int = 1024  # rows of the GPU candidate buffer; more candidates: host decode for that frame
    backend: str = "onnxruntime-cuda"
    device: int = 0
    cuda_graph: bool = False  # the backend replays the model as a CUDA graph (ORT: enable_cuda_graph)

    def __post_init__(self) -> None:
        if self.memory not in MEMORY_MODES:
            raise ConfigError(f"memory mode {self.memory!r} is not one of {', '.join(MEMORY_MODES)}")
        if self.slots < 1:
            raise ConfigError(f"slots must be >= 1, got {self.slots}")
        if self.candidates < 1:
            raise ConfigError(f"candidates must be >= 1, got {self.candidates}")


def ordered_parallel(
    items: Iterable[T],
    workers: Sequence[W],
    process: Callable[[W, T], R],
    enter: Callable[[W], AbstractContextManager[Any]] | None = None,
    prepare: Callable[[W], None] | None = None,
) -> Iterator[tuple[int, R]]:
    """Run ``process(worker, item)`` on one thread per worker; yield ``(index, result)`` in item order.

    Each thread runs inside ``enter(worker)`` (the CUDA context push), calls ``prepare(worker)`` once,
    then takes items one at a time from the shared iterator (so a slow worker simply takes fewer). The
    first exception of any thread stops the others from taking items and is re-raised to the consumer;
    a consumer that stops early (``break``, ``close()``) also stops them. Threads are joined before the
    generator finishes.
    """
    source = iter(items)
    lock = threading.Lock()
    done = threading.Condition()
    results: dict[int, R] = {}
    errors: list[BaseException] = []
    stop = threading.Event()
    counter = [0]
    finished = [0]

    def take() -> tuple[int, T] | None:
        with lock:
            if stop.is_set():
                return None
            try:
                item = next(source)
            except StopIteration:
                return None
            i = counter[0]
            counter[0] += 1
            return i, item

    def loop(worker: W) -> None:
        if prepare is not None:
            prepare(worker)
        while True:
            got = take()
            if got is None:
                return
            i, item = got
            result = process(worker, item)
            with done:
                results[i] = result
                done.notify_all()

    def thread_main(worker: W) -> None:
        try:
            if enter is None:
                loop(worker)
            else:
                with enter(worker):
                    loop(worker)
        except BaseException as exc:  # handed to the consumer, re-raised there
            with done:
                errors.append(exc)
                stop.set()
                done.notify_all()
        finally:
            with done:
                finished[0] += 1
                done.notify_all()

    def generate() -> Iterator[tuple[int, R]]:
        threads = [
            threading.Thread(target=thread_main, args=(w,), name=f"edgert-gpu-slot{k}", daemon=True)
            for k, w in enumerate(workers)
        ]
        for t in threads:
            t.start()
        nxt = 0
        try:
            while True:
                with done:
                    while nxt not in results and not errors and finished[0] < len(threads):
                        done.wait()
                    if errors:
                        raise errors[0]
                    if nxt not in results:
                        return  # every thread has finished and nothing more is coming
                    result = results.pop(nxt)
                yield nxt, result
                nxt += 1
        finally:
            stop.set()
            for t in threads:
                t.join()

    return generate()


@dataclass
class StageTimes:
    """Per-stage GPU milliseconds of every frame (from CUDA events), and the host-side NMS time."""

    gpu_ms: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in GPU_STAGES})
    host_ms: dict[str, list[float]] = field(default_factory=lambda: {"stage_in": [], "finish": []})

    def summary(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for group in (self.gpu_ms, self.host_ms):
            for name, values in group.items():
                if values:
                    arr = np.asarray(values)
                    out[name] = {
                        "median_ms": round(float(np.median(arr)), 4),
                        "p90_ms": round(float(np.percentile(arr, 90)), 4),
                        "mean_ms": round(float(arr.mean()), 4),
                    }
        return out


class _Slot:
    """One session + stream + buffers; used by exactly one worker thread at a time."""

    def __init__(self, pipe: GpuPipeline, session: Any) -> None:
        self.pipe = pipe
        self.session = session
        self.device = session.device
        self.stream = session.stream
        self.input_ptr = session.device_inputs[pipe.input_name].ptr
        self.output_name = pipe.output_name
        self.zero_copy = pipe.memory_mode == "zero-copy"
        self.staging: np.ndarray | None = None  # flat page-locked bytes (mapped when zero-copy)
        self.staging_ptr = 0  # device address of the staging bytes (zero-copy) or of the device copy
        self.frame_buf: Any = None  # device copy of the frame (pinned mode)
        # The decoder keeps scratch buffers, so each slot has its own (the host fallback uses it too).
        self.decoder: Decoder = make_decoder(pipe.config.decode, pipe.output_specs, session.metadata)
        self.filter: GpuCandidateFilter | None = None
        with self.device.active():
            self.events = [self.device.event() for _ in range(5)]
            if pipe.gpu_decode:
                shape = tuple(session.outputs[self.output_name].shape)
                self.filter = GpuCandidateFilter(
                    self.decoder, shape, self.device, pipe.options.candidates, mapped=self.zero_copy
                )
        self.times = StageTimes()

    def _ensure_staging(self, nbytes: int) -> None:
        if self.staging is not None and self.staging.nbytes >= nbytes:
            return
        with self.device.active():
            if self.frame_buf is not None:
                self.frame_buf.free()
                self.frame_buf = None
            self.staging = self.device.pinned_empty((nbytes,), np.uint8, mapped=self.zero_copy)
            if self.zero_copy:
                self.staging_ptr = self.device.device_pointer_of_mapped(self.staging)
            else:
                self.frame_buf = self.device.alloc(nbytes)
                self.staging_ptr = self.frame_buf.ptr

    def process(self, frame: np.ndarray) -> Detections:
        """One frame through the whole GPU path (call with the device context active)."""
        from edgert.backends.cuda import copy_htod_async

        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            got = f"{frame.dtype}{list(frame.shape)}" if isinstance(frame, np.ndarray) else type(frame).__name__
            raise InputError(f"frame | Received {got}. Note: expected an HxWx3 uint8 BGR image")
        h, w = int(frame.shape[0]), int(frame.shape[1])
        if h == 0 or w == 0:
            raise InputError(f"frame | Received an empty image {frame.shape}")
        nbytes = h * w * 3
        t0 = time.perf_counter()
        self._ensure_staging(nbytes)
        staging = self.staging
        if staging is None:  # pragma: no cover - _ensure_staging always sets it
            raise RuntimeError("staging buffer missing")
        view = staging[:nbytes].reshape(h, w, 3)
        np.copyto(view, frame)
        t1 = time.perf_counter()
        s, ev = self.stream, self.events
        ev[0].record(s)
        if not self.zero_copy:
            copy_htod_async(self.staging_ptr, view, s)
        ev[1].record(s)
        transform = self.pipe.letterbox(self.staging_ptr, h, w, self.input_ptr, s)
        ev[2].record(s)
        self.session.compute_only()  # runs on self.stream and synchronises it
        ev[3].record(s)
        filt = self.filter
        if filt is not None:
            filt.enqueue(self.session.device_outputs[self.output_name].ptr, s)
        ev[4].record(s)
        s.synchronize()
        t2 = time.perf_counter()
        det = self._finish(transform)
        t3 = time.perf_counter()
        g = self.times.gpu_ms
        g["upload"].append(ev[1].elapsed_ms(ev[0]))
        g["preprocess"].append(ev[2].elapsed_ms(ev[1]))
        g["infer"].append(ev[3].elapsed_ms(ev[2]))
        g["decode"].append(ev[4].elapsed_ms(ev[3]))
        self.times.host_ms["stage_in"].append((t1 - t0) * 1e3)
        self.times.host_ms["finish"].append((t3 - t2) * 1e3)
        return det

    def _finish(self, transform: LetterboxTransform) -> Detections:
        filt = self.filter
        if filt is not None:
            rows = filt.rows()
            if rows is not None:
                return candidates_to_detections(rows, self.decoder, transform)
        # Host decoding from the whole output (no GPU filter for this layout, or the buffer overflowed).
        from edgert.backends.cuda import copy_dtoh_async

        host = self.session.outputs[self.output_name]
        copy_dtoh_async(host, self.session.device_outputs[self.output_name].ptr, self.stream)
        self.stream.synchronize()
        return self.decoder(self.session.outputs, transform)

    def close(self) -> None:
        with self.device.active():
            if self.filter is not None:
                self.filter.close()
            if self.frame_buf is not None:
                self.frame_buf.free()
            self.staging = None
        self.session.close()


class GpuPipeline:
    """Detect objects in BGR frames with preprocessing, inference and filtering on the GPU.

    ``run(frames)`` yields ``(index, Detections)`` in frame order. Sessions come from ``open_session`` on
    ``options.backend`` (a GPU backend whose sessions expose ``device_inputs``/``device_outputs``,
    ``stream`` and ``compute_only()``), one per slot.
    """

    def __init__(
        self, model: str | Path, config: PipelineConfig | None = None, options: GpuPipelineOptions | None = None
    ) -> None:
        from edgert.backends import SessionOptions, open_session
        from edgert.backends.cuda import device_traits

        self.config = config or PipelineConfig()
        self.options = options or GpuPipelineOptions()
        self.model = Path(model)
        sess_opts = SessionOptions(
            threads=self.config.model.threads, device=self.options.device, cuda_graph=self.options.cuda_graph
        )
        first = open_session(model, self.options.backend, sess_opts)
        self.slots: list[_Slot] = []
        try:
            if not hasattr(first, "device_inputs") or not hasattr(first, "compute_only"):
                raise ConfigError(
                    f"backend {self.options.backend} keeps its buffers on the host; the GPU pipeline "
                    "needs a GPU backend (onnxruntime-cuda or tensorrt)"
                )
            spec = image_input(first)
            self.preprocessor = Preprocessor(self.config.preprocess, spec, first.metadata)
            if tuple(first.inputs[spec.name].shape) != self.preprocessor.input_shape:
                shapes = {spec.name: self.preprocessor.input_shape}
                first.close()
                sess_opts = SessionOptions(
                    threads=self.config.model.threads,
                    device=self.options.device,
                    shapes=shapes,
                    cuda_graph=self.options.cuda_graph,
                )
                first = open_session(model, self.options.backend, sess_opts)
            if self.preprocessor.input_shape[0] != 1:
                shape = list(first.inputs[spec.name].shape)
                raise ModelError(f"the GPU pipeline runs batch 1; the model input is {shape}")
            self.input_name = spec.name
            self.output_specs = concrete_output_specs(first)
            probe = make_decoder(self.config.decode, self.output_specs, first.metadata)
            self.decoder_kind = probe.kind
            self.names = probe.names
            self.output_name = getattr(probe, "output", "")
            out_ok = self.output_name in first.outputs and first.outputs[self.output_name].dtype == np.float32
            self.gpu_decode = self.options.gpu_decode and probe.kind in GPU_DECODE_KINDS and out_ok
            if self.options.gpu_decode and not self.gpu_decode:
                log.info(
                    "decoding %s outputs on the host (GPU filter covers float32 %s)",
                    probe.kind,
                    "/".join(GPU_DECODE_KINDS),
                )
            if not self.output_name:
                self.output_name = first.output_specs[0].name
            self.device: Any = getattr(first, "device")  # noqa: B009 - GPU sessions only (checked above)
            with self.device.active():
                traits = device_traits(self.device)
            self.traits = traits
            self.memory_mode = choose_memory_mode(
                self.options.memory, traits["integrated"], traits["can_map_host_memory"]
            )
            self.plan = LetterboxPlan.from_preprocessor(self.preprocessor)
            self.letterbox = GpuLetterbox(self.plan, self.device)
            self.slots.append(_Slot(self, first))
            for _ in range(self.options.slots - 1):
                self.slots.append(_Slot(self, open_session(model, self.options.backend, sess_opts)))
        except BaseException:
            for slot in self.slots:
                slot.close()
            if not self.slots:
                first.close()
            raise
        log.info(
            "GPU pipeline: %d slots, memory %s, decode %s",
            len(self.slots),
            self.memory_mode,
            "GPU filter + CPU NMS" if self.gpu_decode else "host",
        )

    # -- running -------------------------------------------------------------------------------------
    def run(self, frames: Iterable[np.ndarray]) -> Iterator[tuple[int, Detections]]:
        """Process ``frames`` on all slots; yield ``(index, detections)`` in order."""
        barrier = threading.Barrier(len(self.slots)) if self.options.cuda_graph else None
        capture_lock = threading.Lock()

        def prepare(slot: _Slot) -> None:
            if barrier is not None:
                self._capture_graph(slot, barrier, capture_lock)

        return ordered_parallel(
            frames, self.slots, _Slot.process, enter=lambda slot: slot.device.active(), prepare=prepare
        )

    @staticmethod
    def _capture_graph(slot: _Slot, barrier: threading.Barrier, lock: threading.Lock) -> None:
        """Let ONNX Runtime capture this slot's CUDA graph, one slot at a time, before any frame.

        ORT keeps the graph in the calling thread's context and captures it on an early run in
        ``cudaStreamCaptureModeGlobal``, which makes CUDA calls from any other thread meanwhile fail
        ("operation not permitted when stream is capturing"). So every worker first makes its context
        current, then the workers take turns for their capture runs, and nobody starts frames until all
        slots are captured. (Seen on the H200 before this: concurrent captures failed.)
        """
        try:
            barrier.wait(timeout=_GRAPH_WAIT_S)
            with lock:
                for _ in range(_GRAPH_CAPTURE_RUNS):
                    slot.session.compute_only()
            barrier.wait(timeout=_GRAPH_WAIT_S)
        except threading.BrokenBarrierError:
            raise BackendError("another GPU pipeline slot failed while the CUDA graphs were being captured") from None
        except BaseException:
            barrier.abort()  # the other workers stop waiting for this one
            raise

    def warm_up(self, runs: int = 2) -> None:
        """Run each slot's model ``runs`` times on whatever its input holds: cuDNN chooses its algorithms
        and the memory arenas grow on the first runs, which should not count as frames."""
        with self.device.active():
            for slot in self.slots:
                for _ in range(max(0, runs)):
                    slot.session.compute_only()

    def detect(self, frame: np.ndarray) -> Detections:
        """One frame on the first slot (for checks; ``run`` is the fast path)."""
        slot = self.slots[0]
        with slot.device.active():
            return slot.process(frame)

    def preprocess_to_host(self, frame: np.ndarray) -> tuple[np.ndarray, LetterboxTransform]:
        """The GPU-made input tensor of ``frame``, copied to the host (to compare with the CPU path)."""
        from edgert.backends.cuda import copy_dtoh_async, copy_htod_async

        slot = self.slots[0]
        with slot.device.active():
            h, w = frame.shape[:2]
            slot._ensure_staging(frame.nbytes)
            staging = slot.staging
            if staging is None:  # pragma: no cover
                raise RuntimeError("staging buffer missing")
            view = staging[: frame.nbytes].reshape(h, w, 3)
            np.copyto(view, frame)
            if not slot.zero_copy:
                copy_htod_async(slot.staging_ptr, view, slot.stream)
            transform = self.letterbox(slot.staging_ptr, h, w, slot.input_ptr, slot.stream)
            host = slot.session.inputs[self.input_name]
            copy_dtoh_async(host, slot.input_ptr, slot.stream)
            slot.stream.synchronize()
            return host.copy(), transform

    def stage_times(self) -> dict[str, dict[str, float]]:
        merged = StageTimes()
        for slot in self.slots:
            for k, v in slot.times.gpu_ms.items():
                merged.gpu_ms[k].extend(v)
            for k, v in slot.times.host_ms.items():
                merged.host_ms[k].extend(v)
        return merged.summary()

    def reset_times(self) -> None:
        for slot in self.slots:
            slot.times = StageTimes()

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "slots": len(self.slots),
            "memory": self.memory_mode,
            "device_traits": self.traits,
            "decode": "gpu-filter+cpu-nms" if self.gpu_decode else "host",
            "decoder": self.decoder_kind,
            "input": list(self.preprocessor.input_shape),
            "input_dtype": str(self.preprocessor.input_dtype),
            "layout": self.plan.layout,
        }

    # -- lifetime ------------------------------------------------------------------------------------
    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots = []
        if hasattr(self, "letterbox"):
            self.letterbox.close()

    def __enter__(self) -> GpuPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
