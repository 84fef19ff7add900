"""The GPU processor: preprocessing and the confidence filter on the GPU, several slots in flight.

A *slot* is one GPU session (an ONNX Runtime CUDA session, or an execution context of one shared TensorRT
engine: ``Session.fork``) with its own CUDA stream, device input/output buffers, a frame staging buffer
and a candidate buffer. The pipeline drives each slot from its own thread; for every frame a slot:

1. copies the decoded BGR frames of its batch into the slot's page-locked staging buffer, packed (host memcpy);
2. ``pinned``: uploads them with one async copy; ``zero-copy``: nothing, the kernel reads the mapped
   staging buffer through its device address (on Jetson that is the same DRAM);
3. runs the letterbox kernel once for the batch into the session's device input buffer;
4. runs the model on the device buffers (``session.compute_only()``: IOBinding / tensor addresses, no host copies),
   a part batch at its own size where the model allows (``GpuSession.use_rows``; ``runtime.part_batches``);
5. runs the confidence filter once for the batch into the candidate buffer, then (``gpu_nms``, the default
   where the decoder allows it) NMS, ``max_det`` and the mapping to the frame for every sample in one launch
   (:mod:`edgert.vision.gpu_nms`), and copies the batch's final boxes back in one copy;
6. synchronises the stream once (the model was queued without ONNX Runtime's own wait: ``compute_async``)
   and cuts each frame's detections out of three arrays. Without ``gpu_nms``: the filter's rows come back,
   and the NMS and the mapping run on the CPU.

So a batch of 8 costs the same handful of CUDA calls as one frame (measured before this: per-sample launches
made 8 streams of nanodet host-bound, docs/pipeline.md).

ONNX Runtime and TensorRT release the GIL while they run, so with two or more slots the upload and
preprocessing of frame N+1 run while frame N infers, and the readback and NMS of N-1 overlap both. CUDA
events around each step of one batch in ``_TIME_EVERY`` give per-stage GPU times (``upload``, ``preprocess``,
``infer``, ``decode``), kept in fixed rings like every other statistic (the summary's ``gpu_ms``).

The interpreter lock: at many streams the slot threads, the capture collector and the results thread share one
lock, and a thread that gives it up (a blocking call) may wait up to the switch interval (5 ms) to get it back. So
a batch gives it up twice, in ONNX Runtime's run and in the one wait for the tail; the uploads, launches and the
copy back are driver calls that only queue work and keep it (docs/pipeline.md).

Memory: :func:`choose_memory_mode` picks zero-copy (mapped page-locked memory) on integrated GPUs that
can map host memory, pinned copies on discrete GPUs; both can be asked for (``runtime.memory``). On a
discrete GPU zero-copy reads the frame over PCIe, once per output pixel's taps: it works, and it is slower.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import BackendError, ConfigError, NoMoreContexts
from edgert.pipeline.gpu_memory import MEMORY_MODES, choose_memory_mode
from edgert.pipeline.gpu_slot import GPU_STAGES, GpuSlot
from edgert.pipeline.processor import Processor, ProcessorSlot, default_slots, keep_trial_slot, slots_wanted
from edgert.stats import STAGES, merged_quantiles_ms
from edgert.vision.detections import Detections
from edgert.vision.gpu_decode import GPU_DECODE_KINDS
from edgert.vision.gpu_nms import gpu_nms_fits
from edgert.vision.gpu_preprocess import GpuLetterbox, LetterboxPlan
from edgert.vision.opened import fill_other_inputs, open_model
from edgert.vision.preprocess import LetterboxTransform

if TYPE_CHECKING:
    from edgert.backends import Session
    from edgert.backends.cuda import CudaDevice, HostRegistration
    from edgert.backends.gpu_session import GpuSession
    from edgert.pipeline.parts import JSONDict

__all__ = ["GPU_STAGES", "MEMORY_MODES", "GpuProcessor", "GpuSlot", "choose_memory_mode"]

log = logging.getLogger(__name__)

#: ONNX Runtime captures after 2 regular runs (min_num_runs_before_cuda_graph_capture_); 3 runs cover it.
_GRAPH_CAPTURE_RUNS = 3
_GRAPH_WAIT_S = 300.0
#: Rows of the GPU candidate buffer; a frame with more candidates is decoded on the host from the whole output.
CANDIDATES = 1024


class GpuProcessor(Processor):
    """Detect objects with preprocessing, inference and filtering on the GPU, ``runtime.slots`` frames at once.

    Sessions come from ``open_session`` on ``backend`` (a GPU backend whose sessions expose
    ``device_inputs``/``device_outputs``, ``stream``, ``compute_only()`` and ``fork()``): one opened, the
    other slots forked from it (TensorRT: one engine, a context per slot).
    """

    kind = "gpu"

    def __init__(self, config: PipelineConfig, backend: str = "onnxruntime-cuda", *, gpu_decode: bool = True,
                 gpu_nms: bool = True, candidates: int = CANDIDATES, device: int = 0, batch: int = 1) -> None:
        super().__init__()
        from edgert.backends import SessionOptions

        # address -> (bytes, device address when mapped) of the frame buffers handed out (read by the slots)
        self.frame_buffers: dict[int, tuple[int, int]] = {}
        self._frame_arrays: list[np.ndarray] = []
        self._registrations: list[HostRegistration] = []  # capture workers' rings page-locked (register_frames)
        self._buffers_lock = threading.Lock()
        from edgert.backends.cuda import device_traits
        from edgert.backends.gpu_session import GpuSession

        if candidates < 1:
            raise ConfigError(f"candidates must be >= 1, got {candidates}")
        self.config = config
        self.candidates = candidates
        self.cuda_graph = bool(config.runtime.cuda_graph)
        # CUDA graphs are captured in every slot at once: no slot on trial with them
        wanted = slots_wanted(config, "gpu", 1 if self.cuda_graph else batch)
        self.trial_slot = wanted > default_slots("gpu") and config.runtime.slots is None  # warm_up decides
        self.warmup_model_ms: float | None = None  # the fastest warm-up run of a slot's model
        self.warmup_s: float | None = None  # the whole warm-up, part-batch sizes included
        self.slots_rule = f"{wanted} ({'runtime.slots' if config.runtime.slots is not None else 'default'})"
        sess_opts = SessionOptions(threads=config.model.threads, device=device, cuda_graph=self.cuda_graph)
        ready = open_model(config, backend, batch=batch, options=sess_opts, gpu=True)
        first = ready.session
        assert isinstance(first, GpuSession)  # open_model(gpu=True) refuses any other, in one line
        opened: list[Session] = [first]
        try:
            self.preprocessor = ready.preprocessor
            self.batch = batch
            self.backend_name = first.backend_name
            self.input_name = ready.input_name
            self.input_shape = tuple(first.inputs[self.input_name].shape)
            self.input_dtype = str(self.preprocessor.input_dtype)
            self.output_specs = ready.output_specs
            probe = ready.decoder
            self.decoder_kind = probe.kind
            self.names = tuple(probe.names)
            self.output_name = getattr(probe, "output", "") or first.output_specs[0].name
            out_ok = self.output_name in first.outputs and first.outputs[self.output_name].dtype == np.float32
            self.gpu_decode = gpu_decode and probe.kind in GPU_DECODE_KINDS and out_ok
            if gpu_decode and not self.gpu_decode:
                log.info("decoding %s outputs on the host (GPU filter covers float32 %s)", probe.kind,
                         "/".join(GPU_DECODE_KINDS))
            why = gpu_nms_fits(probe, candidates, batch) if self.gpu_decode and gpu_nms else "not asked for"
            self.gpu_nms = not why
            if self.gpu_decode and gpu_nms and why:
                log.info("NMS on the host: %s", why)
            self.device: CudaDevice = ready.device
            with self.device.active():
                self.traits = device_traits(self.device)
            self.memory_mode = choose_memory_mode(config.runtime.memory or "auto", self.traits["integrated"],
                                                  self.traits["can_map_host_memory"])
            self.plan = LetterboxPlan.from_preprocessor(self.preprocessor)
            self.letterbox = GpuLetterbox(self.plan, self.device)
            self._fill_other_inputs(first)
            self.slots.append(GpuSlot(self, first))
            opened.clear()  # the slot owns it now
            for _ in range(wanted - 1):
                try:
                    fork = first.fork()
                except NoMoreContexts as exc:  # the engine allows fewer contexts than slots wanted
                    log.warning("GPU processing: %d slot(s), not %d: %s", len(self.slots), wanted, exc)
                    self.slots_rule = f"{len(self.slots)} (the engine's contexts; {wanted} wanted)"
                    break
                opened.append(fork)
                assert isinstance(fork, GpuSession)  # a GPU session's fork is one (each backend's own class)
                self._fill_other_inputs(fork)
                self.slots.append(GpuSlot(self, fork))
                opened.clear()
        except BaseException:
            for session in opened:
                session.close()
            self.close()
            raise
        self.batch_sizes, self.batch_sizes_rule = self._allow_part_batches(config.runtime.part_batches)
        self._barrier = threading.Barrier(len(self.slots)) if self.cuda_graph else None
        self._capture_lock = threading.Lock()
        log.info("GPU processing: %s, memory %s, decode %s", self.slots_rule, self.memory_mode, self._decode_kind())

    def _allow_part_batches(self, wanted: bool | None) -> tuple[tuple[int, ...], str]:
        """Let every slot run part batches at their own size unless ``runtime.part_batches`` is false; (the sizes,
        the rule as the summary says it). Asked for where the model runs one size: refused in one line."""
        if wanted is False:
            return (self.batch,), "runtime.part_batches: false"
        slots = self._gpu_slots()
        if wanted is None and self.traits["integrated"] and slots[0].session.sizes_cost_memory:
            # ONNX Runtime keeps a session per size (0.8-2.2 GiB a slot for NanoDet / YOLOv8s on the H100), which on
            # an integrated GPU is the CPU's memory too; TensorRT changes size within one context
            return (self.batch,), f"one batch size: {self.backend_name} on an integrated GPU (a size costs memory)"
        sizes: tuple[int, ...] = (self.batch,)
        why = ""
        for slot in slots:
            sizes, why = slot.session.allow_part_batches()
        if len(sizes) > 1:
            return sizes, "part batches at their own size (the model's batch is dynamic)"
        if wanted and self.batch > 1:
            self.close()
            raise ConfigError(f"runtime.part_batches: true: {why}. Note: drop the key to run every call at batch "
                              f"{self.batch}")
        return sizes, "one batch size" + (f": {why}" if why else "")

    def _decode_kind(self) -> str:
        if not self.gpu_decode:
            return "host"
        return "gpu-filter+gpu-nms" if self.gpu_nms else "gpu-filter+cpu-nms"

    def frame_buffer(self, height: int, width: int) -> np.ndarray | None:
        """A page-locked HxWx3 uint8 buffer (mapped when zero-copy) that the slots take without a host copy."""
        zero_copy = self.memory_mode == "zero-copy"
        with self.device.active():
            buf: np.ndarray = self.device.pinned_empty((height, width, 3), np.uint8, mapped=zero_copy)
            ptr = self.device.device_pointer_of_mapped(buf) if zero_copy else 0
        with self._buffers_lock:
            self.frame_buffers[buf.__array_interface__["data"][0]] = (buf.nbytes, ptr)
            self._frame_arrays.append(buf)
        return buf

    def register_frames(self, array: np.ndarray, slot_bytes: int, slots: int) -> None:
        """Pin a capture worker's frame ring (page-aligned uint8, ``slots`` frames ``slot_bytes`` apart) for the
        slots: each frame there is then uploaded with one DMA (mapped, zero-copy: read in place), as a
        :meth:`frame_buffer`'s. The registration ends with the processor (:meth:`close`)."""
        from edgert.backends.cuda import register_host_memory

        zero_copy = self.memory_mode == "zero-copy"
        with self.device.active():
            registration = register_host_memory(array, mapped=zero_copy)
        base, ptr = registration.address, registration.ptr
        with self._buffers_lock:
            for k in range(slots):
                self.frame_buffers[base + k * slot_bytes] = (slot_bytes, ptr + k * slot_bytes if zero_copy else 0)
            self._registrations.append(registration)

    def _fill_other_inputs(self, session: GpuSession) -> None:
        """The configured constants for inputs other than the image (as the CPU processor fills them), put on
        the device once: ``compute_only`` never copies inputs, so a host value alone would leave zeros there."""
        fill_other_inputs(session, self.input_name, self.config.model.inputs, str(self.config.model.path))
        others = [name for name in session.inputs if name != self.input_name]
        if others:
            with self.device.active():
                for name in others:
                    session.device_inputs[name].copy_from_host_async(session.inputs[name], session.stream)
                session.stream.synchronize()

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
        """Run each slot's model ``runs`` times (at most 2: more would let ORT capture CUDA graphs on this thread):
        cuDNN chooses its algorithms and the arenas grow; the fastest run decides on a slot on trial. Then each
        part-batch size once per slot (ONNX Runtime's cuDNN search is per shape: 0.3-0.75 s a size on the H100)."""
        fastest: float | None = None
        started = time.perf_counter()
        with self.device.active():
            for slot in self.slots:
                assert isinstance(slot, GpuSlot)
                for _ in range(min(max(0, runs), 2)):
                    t0 = time.perf_counter()
                    slot.session.compute_only()  # returns after the stream's sync: the batch's model time
                    fastest = self.warmup_model_ms = min(fastest or 1e9, (time.perf_counter() - t0) * 1e3)
            if self.trial_slot:
                self.trial_slot, kept = False, keep_trial_slot(fastest)
                seen = "no warm-up run" if fastest is None else f"model {fastest:.1f} ms a batch"
                self.slots_rule = f"{len(self.slots) - (not kept)} slots (default: {seen})"
                if not kept:
                    self.slots.pop().close()
                log.info("GPU processing: %s", self.slots_rule)
            if runs > 0 and len(self.batch_sizes) > 1:
                for slot in self._gpu_slots():
                    for size in (*self.batch_sizes[:-1], self.batch):
                        slot.session.use_rows(size)
                        slot.session.compute_only()
        self.warmup_s = round(time.perf_counter() - started, 2)
        log.info("GPU processing: warm-up %.1f s (batch sizes %s)", self.warmup_s, list(self.batch_sizes))

    def describe(self) -> JSONDict:
        return {
            "kind": self.kind,
            "slots": len(self.slots),
            "slots_rule": self.slots_rule,
            "memory": self.memory_mode,
            "cuda_graph": self.cuda_graph,
            "device_traits": self.traits,
            "decode": self._decode_kind(),
            "decoder": self.decoder_kind,
            "layout": self.plan.layout,
            "batch": self.batch,
            "batch_sizes": list(self.batch_sizes),
            "batch_sizes_rule": self.batch_sizes_rule,
            "calls_at": self._calls_at(),
            "warmup_s": self.warmup_s,
            "candidate_overflows": sum(s.filter.overflows for s in self._gpu_slots() if s.filter is not None),
        }

    def _calls_at(self) -> dict[str, int]:
        """Engine calls by the batch size they ran at, every slot's together (JSON keys: strings)."""
        total: dict[int, int] = {}
        for slot in self._gpu_slots():
            for size, n in slot.calls_at.items():
                total[size] = total.get(size, 0) + n
        return {str(size): total[size] for size in sorted(total)}

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
            return slot.process([frame], [np.zeros(len(STAGES))])[0]

    def preprocess_to_host(self, frame: np.ndarray) -> tuple[np.ndarray, LetterboxTransform]:
        """The GPU-made input tensor of ``frame``, copied to the host (to compare with the CPU path)."""
        from edgert.backends.cuda import copy_dtoh_async

        slot = self._gpu_slots()[0]
        with slot.device.active():
            ((ptr, h, w),) = slot._stage_in([frame])
            transform = self.letterbox(ptr, h, w, slot.input_ptr, slot.stream)
            host = slot.session.inputs[self.input_name]
            copy_dtoh_async(host, slot.input_ptr, slot.stream)
            slot.stream.synchronize()
            return host[:1].copy(), transform

    # -- lifetime ------------------------------------------------------------------------------------
    def close(self) -> None:
        super().close()
        device = getattr(self, "device", None)
        if device is not None and (self._frame_arrays or self._registrations):
            # Dropped with the context current, so pycuda can unpin them (the pipeline has let go of its frames).
            with device.active():
                self.frame_buffers.clear()
                self._frame_arrays.clear()
                for registration in self._registrations:
                    registration.close()
                self._registrations.clear()
        letterbox = getattr(self, "letterbox", None)
        if letterbox is not None:
            letterbox.close()
            self.letterbox = None  # type: ignore[assignment]
