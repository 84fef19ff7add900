"""The GPU processor: preprocessing and the confidence filter on the GPU, several slots in flight.

A *slot* is one GPU session (an ONNX Runtime CUDA session, or an execution context of one shared TensorRT
engine: ``Session.fork``) with its own CUDA stream, device input/output buffers, a frame staging buffer
and a candidate buffer. The pipeline drives each slot from its own thread; for every frame a slot:

1. copies the decoded BGR frame into the slot's page-locked staging buffer (host memcpy);
2. ``pinned``: uploads it with one async copy; ``zero-copy``: nothing, the kernel reads the mapped
   staging buffer through its device address (on Jetson that is the same DRAM);
3. runs the letterbox kernel into the session's device input buffer;
4. runs the model on the device buffers (``session.compute_only()``: IOBinding / tensor addresses, no host copies);
5. runs the confidence filter into the candidate buffer and copies the few rows back;
6. synchronises the stream, then NMS and the mapping to the frame on the CPU.

ONNX Runtime and TensorRT release the GIL while they run, so with two or more slots the upload and
preprocessing of frame N+1 run while frame N infers, and the readback and NMS of N-1 overlap both. CUDA
events around each step give per-stage GPU times (``upload``, ``preprocess``, ``infer``, ``decode``), kept in
fixed rings like every other statistic (the summary's ``gpu_ms``).

Memory: :func:`choose_memory_mode` picks zero-copy (mapped page-locked memory) on integrated GPUs that
can map host memory, pinned copies on discrete GPUs; both can be asked for (``runtime.memory``). On a
discrete GPU zero-copy reads the frame over PCIe, once per output pixel's taps: it works, and it is slower.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import BackendError, ConfigError, InputError, ModelError
from edgert.pipeline.processor import Processor, ProcessorSlot, slots_wanted
from edgert.pipeline.stats import STAGES, LatencyRing, merged_quantiles_ms
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.detections import Detections
from edgert.vision.detector import concrete_output_specs, image_input
from edgert.vision.gpu_decode import GPU_DECODE_KINDS, GpuCandidateFilter, candidates_to_detections
from edgert.vision.gpu_preprocess import GpuLetterbox, LetterboxPlan
from edgert.vision.preprocess import LetterboxTransform, Preprocessor

__all__ = ["GPU_STAGES", "MEMORY_MODES", "GpuProcessor", "GpuSlot", "choose_memory_mode"]

log = logging.getLogger(__name__)

MEMORY_MODES = ("auto", "pinned", "zero-copy")
#: ONNX Runtime captures after 2 regular runs (min_num_runs_before_cuda_graph_capture_); 3 runs cover it.
_GRAPH_CAPTURE_RUNS = 3
_GRAPH_WAIT_S = 300.0
GPU_STAGES = ("upload", "preprocess", "infer", "decode")
_PRE, _INFER, _POST = STAGES.index("preprocess"), STAGES.index("infer"), STAGES.index("postprocess")
#: Rows of the GPU candidate buffer; a frame with more candidates is decoded on the host from the whole output.
CANDIDATES = 1024


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
            raise ConfigError("runtime.memory: zero-copy: this GPU cannot map host memory (CAN_MAP_HOST_MEMORY "
                              "is 0). Note: use --memory pinned")
        return "zero-copy"
    return "zero-copy" if integrated and can_map else "pinned"


class GpuSlot(ProcessorSlot):
    """One session + stream + buffers; used by exactly one pipeline thread at a time."""

    def __init__(self, proc: GpuProcessor, session: Any) -> None:
        self.proc = proc
        self.session = session
        self.device = session.device
        self.stream = session.stream
        self.input_ptr = session.device_inputs[proc.input_name].ptr
        self.output_name = proc.output_name
        self.zero_copy = proc.memory_mode == "zero-copy"
        self.staging: np.ndarray | None = None  # flat page-locked bytes (mapped when zero-copy)
        self.staging_ptr = 0  # device address of the staging bytes (zero-copy) or of the device copy
        self.frame_buf: Any = None  # device copy of the frame (pinned mode)
        # The decoder keeps scratch buffers, so each slot has its own (the host fallback uses it too).
        self.decoder: Decoder = make_decoder(proc.config.decode, proc.output_specs, session.metadata)
        self.filter: GpuCandidateFilter | None = None
        with self.device.active():
            self.events = [self.device.event() for _ in range(5)]
            if proc.gpu_decode:
                shape = tuple(session.outputs[self.output_name].shape)
                self.filter = GpuCandidateFilter(self.decoder, shape, self.device, proc.candidates,
                                                 mapped=self.zero_copy)
        # Per-stage GPU times of the recent frames, in fixed rings (nothing grows with the run's length).
        self.gpu_times = {stage: LatencyRing() for stage in GPU_STAGES}

    def active(self) -> AbstractContextManager[Any]:
        return self.device.active()  # type: ignore[no-any-return]

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

    def _stage_in(self, frame: np.ndarray) -> tuple[int, int, np.ndarray]:
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            got = f"{frame.dtype}{list(frame.shape)}" if isinstance(frame, np.ndarray) else type(frame).__name__
            raise InputError(f"frame | Received {got}. Note: expected an HxWx3 uint8 BGR image")
        h, w = int(frame.shape[0]), int(frame.shape[1])
        if h == 0 or w == 0:
            raise InputError(f"frame | Received an empty image {frame.shape}")
        nbytes = h * w * 3
        self._ensure_staging(nbytes)  # once per frame size: a camera's frames all have one
        staging = self.staging
        if staging is None:  # pragma: no cover - _ensure_staging always sets it
            raise RuntimeError("staging buffer missing")
        view = staging[:nbytes].reshape(h, w, 3)
        np.copyto(view, frame)
        return h, w, view

    def process(self, frame: np.ndarray, timings: np.ndarray) -> Detections:
        """One frame through the whole GPU path (called with the device context active)."""
        from edgert.backends.cuda import copy_htod_async

        t0 = time.perf_counter()
        h, w, view = self._stage_in(frame)
        s, ev = self.stream, self.events
        ev[0].record(s)
        if not self.zero_copy:
            copy_htod_async(self.staging_ptr, view, s)
        ev[1].record(s)
        transform = self.proc.letterbox(self.staging_ptr, h, w, self.input_ptr, s)
        ev[2].record(s)
        t1 = time.perf_counter()
        self.session.compute_only()  # runs on self.stream and synchronises it
        ev[3].record(s)
        t2 = time.perf_counter()
        filt = self.filter
        if filt is not None:
            filt.enqueue(self.session.device_outputs[self.output_name].ptr, s)
        ev[4].record(s)
        s.synchronize()
        det = self._finish(transform)
        t3 = time.perf_counter()
        g = self.gpu_times
        g["upload"].add(ev[1].elapsed_ms(ev[0]) / 1e3)
        g["preprocess"].add(ev[2].elapsed_ms(ev[1]) / 1e3)
        g["infer"].add(ev[3].elapsed_ms(ev[2]) / 1e3)
        g["decode"].add(ev[4].elapsed_ms(ev[3]) / 1e3)
        timings[_PRE] = t1 - t0  # host: staging copy and the enqueues (the GPU work itself is under gpu_ms)
        timings[_INFER] = t2 - t1  # waits for upload + letterbox + the model on this slot's stream
        timings[_POST] = t3 - t2
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


class GpuProcessor(Processor):
    """Detect objects with preprocessing, inference and filtering on the GPU, ``runtime.slots`` frames at once.

    Sessions come from ``open_session`` on ``backend`` (a GPU backend whose sessions expose
    ``device_inputs``/``device_outputs``, ``stream``, ``compute_only()`` and ``fork()``): one opened, the
    other slots forked from it (TensorRT: one engine, a context per slot).
    """

    kind = "gpu"

    def __init__(self, config: PipelineConfig, backend: str = "onnxruntime-cuda", *, gpu_decode: bool = True,
                 candidates: int = CANDIDATES, device: int = 0) -> None:
        super().__init__()
        from edgert.backends import SessionOptions, open_session
        from edgert.backends.cuda import device_traits

        if candidates < 1:
            raise ConfigError(f"candidates must be >= 1, got {candidates}")
        self.config = config
        self.candidates = candidates
        self.cuda_graph = bool(config.runtime.cuda_graph)
        wanted = slots_wanted(config, "gpu")
        model = config.model.path
        sess_opts = SessionOptions(threads=config.model.threads, device=device, cuda_graph=self.cuda_graph)
        first = open_session(model, backend, sess_opts)
        opened: list[Any] = [first]
        try:
            if not hasattr(first, "device_inputs") or not hasattr(first, "compute_only"):
                raise ConfigError(f"runtime.processing: gpu: backend {backend} keeps its buffers on the host; GPU "
                                  f"processing needs one of tensorrt, tensorrt-rtx, onnxruntime-cuda")
            spec = image_input(first)
            self.preprocessor = Preprocessor(config.preprocess, spec, first.metadata)
            if tuple(first.inputs[spec.name].shape) != self.preprocessor.input_shape:
                shapes = {spec.name: self.preprocessor.input_shape}
                first.close()
                opened.clear()
                sess_opts = SessionOptions(threads=config.model.threads, device=device, shapes=shapes,
                                           cuda_graph=self.cuda_graph)
                first = open_session(model, backend, sess_opts)
                opened.append(first)
            if self.preprocessor.input_shape[0] != 1:
                shape = list(first.inputs[spec.name].shape)
                raise ModelError(f"GPU processing runs batch 1; the model input is {shape}")
            self.backend_name = first.backend_name
            self.input_name = spec.name
            self.input_shape = tuple(self.preprocessor.input_shape)
            self.input_dtype = str(self.preprocessor.input_dtype)
            self.output_specs = concrete_output_specs(first)
            probe = make_decoder(config.decode, self.output_specs, first.metadata)
            self.decoder_kind = probe.kind
            self.names = tuple(probe.names)
            self.output_name = getattr(probe, "output", "") or first.output_specs[0].name
            out_ok = self.output_name in first.outputs and first.outputs[self.output_name].dtype == np.float32
            self.gpu_decode = gpu_decode and probe.kind in GPU_DECODE_KINDS and out_ok
            if gpu_decode and not self.gpu_decode:
                log.info("decoding %s outputs on the host (GPU filter covers float32 %s)", probe.kind,
                         "/".join(GPU_DECODE_KINDS))
            self.device: Any = getattr(first, "device")  # noqa: B009 - GPU sessions only (checked above)
            with self.device.active():
                self.traits = device_traits(self.device)
            self.memory_mode = choose_memory_mode(config.runtime.memory or "auto", self.traits["integrated"],
                                                  self.traits["can_map_host_memory"])
            self.plan = LetterboxPlan.from_preprocessor(self.preprocessor)
            self.letterbox = GpuLetterbox(self.plan, self.device)
            self.slots.append(GpuSlot(self, first))
            opened.clear()  # the slot owns it now
            for _ in range(wanted - 1):
                fork = first.fork()
                opened.append(fork)
                self.slots.append(GpuSlot(self, fork))
                opened.clear()
        except BaseException:
            for session in opened:
                session.close()
            self.close()
            raise
        self._barrier = threading.Barrier(len(self.slots)) if self.cuda_graph else None
        self._capture_lock = threading.Lock()
        log.info("GPU processing: %d slots, memory %s, decode %s", len(self.slots), self.memory_mode,
                 "GPU filter + CPU NMS" if self.gpu_decode else "host")

    # -- the pipeline's hooks ----------------------------------------------------------------------
    def prepare(self, slot: ProcessorSlot) -> None:
        if self._barrier is not None:
            assert isinstance(slot, GpuSlot)
            self._capture_graph(slot, self._barrier, self._capture_lock)

    @staticmethod
    def _capture_graph(slot: GpuSlot, barrier: threading.Barrier, lock: threading.Lock) -> None:
        """Let ONNX Runtime capture this slot's CUDA graph, one slot at a time, before any frame.

        ORT keeps the graph in the calling thread's context and captures it on an early run in
        ``cudaStreamCaptureModeGlobal``, which makes CUDA calls from any other thread meanwhile fail
        ("operation not permitted when stream is capturing"). So every slot thread first makes its context
        current, then the threads take turns for their capture runs, and nobody starts frames until all
        slots are captured. (Seen on the H200 before this: concurrent captures failed.)
        """
        try:
            barrier.wait(timeout=_GRAPH_WAIT_S)
            with lock:
                for _ in range(_GRAPH_CAPTURE_RUNS):
                    slot.session.compute_only()
            barrier.wait(timeout=_GRAPH_WAIT_S)
        except threading.BrokenBarrierError:
            raise BackendError("another GPU slot failed while the CUDA graphs were being captured") from None
        except BaseException:
            barrier.abort()  # the other slot threads stop waiting for this one
            raise

    def warm_up(self, runs: int) -> None:
        """Run each slot's model ``runs`` times (at most 2: more would let ORT capture CUDA graphs on this
        thread): cuDNN chooses its algorithms and the arenas grow on the first runs."""
        with self.device.active():
            for slot in self.slots:
                assert isinstance(slot, GpuSlot)
                for _ in range(min(max(0, runs), 2)):
                    slot.session.compute_only()

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "slots": len(self.slots),
            "memory": self.memory_mode,
            "cuda_graph": self.cuda_graph,
            "device_traits": self.traits,
            "decode": "gpu-filter+cpu-nms" if self.gpu_decode else "host",
            "decoder": self.decoder_kind,
            "layout": self.plan.layout,
            "candidate_overflows": sum(s.filter.overflows for s in self._gpu_slots() if s.filter is not None),
        }

    def stage_summary(self) -> dict[str, dict[str, float]]:
        slots = self._gpu_slots()
        return {stage: merged_quantiles_ms([s.gpu_times[stage] for s in slots]) for stage in GPU_STAGES}

    def _gpu_slots(self) -> list[GpuSlot]:
        return [s for s in self.slots if isinstance(s, GpuSlot)]

    # -- checks (tests and benchmarks; the pipeline uses the slots) --------------------------------
    def detect(self, frame: np.ndarray) -> Detections:
        """One frame on the first slot."""
        slot = self._gpu_slots()[0]
        with slot.device.active():
            return slot.process(frame, np.zeros(len(STAGES)))

    def preprocess_to_host(self, frame: np.ndarray) -> tuple[np.ndarray, LetterboxTransform]:
        """The GPU-made input tensor of ``frame``, copied to the host (to compare with the CPU path)."""
        from edgert.backends.cuda import copy_dtoh_async, copy_htod_async

        slot = self._gpu_slots()[0]
        with slot.device.active():
            h, w, view = slot._stage_in(frame)
            if not slot.zero_copy:
                copy_htod_async(slot.staging_ptr, view, slot.stream)
            transform = self.letterbox(slot.staging_ptr, h, w, slot.input_ptr, slot.stream)
            host = slot.session.inputs[self.input_name]
            copy_dtoh_async(host, slot.input_ptr, slot.stream)
            slot.stream.synchronize()
            return host.copy(), transform

    # -- lifetime ------------------------------------------------------------------------------------
    def close(self) -> None:
        super().close()
        letterbox = getattr(self, "letterbox", None)
        if letterbox is not None:
            letterbox.close()
            self.letterbox = None  # type: ignore[assignment]
