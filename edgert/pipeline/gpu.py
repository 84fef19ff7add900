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
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import BackendError, ConfigError, NoMoreContexts
from edgert.pipeline.gpu_memory import ALIGN, MEMORY_MODES, Staging, choose_memory_mode
from edgert.pipeline.processor import Processor, ProcessorSlot, default_slots, keep_trial_slot, slots_wanted
from edgert.stats import STAGES, LatencyRing, merged_quantiles_ms
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.detections import Detections
from edgert.vision.gpu_decode import GPU_DECODE_KINDS, GpuCandidateFilter, finish_candidates
from edgert.vision.gpu_nms import GpuNms, gpu_nms_fits
from edgert.vision.gpu_preprocess import BATCH_COLS, GpuLetterbox, LetterboxPlan
from edgert.vision.opened import fill_other_inputs, open_model
from edgert.vision.preprocess import LetterboxTransform, check_frame

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
GPU_STAGES = ("upload", "preprocess", "infer", "decode")
_PRE, _INFER, _POST = STAGES.index("preprocess"), STAGES.index("infer"), STAGES.index("postprocess")
#: Rows of the GPU candidate buffer; a frame with more candidates is decoded on the host from the whole output.
CANDIDATES = 1024
#: The per-stage GPU times are taken on one batch in this many: each event record or read is a driver call made
#: with the interpreter lock held (nine per timed batch), and the rings are quantiles of a sample anyway.
_TIME_EVERY = 8


class GpuSlot(ProcessorSlot):
    """One session + stream + buffers for ``batch`` frames per call; used by exactly one pipeline thread.

    A batch costs the same number of CUDA calls as one frame: the frames are packed into one staging
    buffer (one upload), one letterbox launch makes every sample of the batched input (their geometry in
    one small table), and one filter launch and one copy bring every sample's candidates back.
    """

    def __init__(self, proc: GpuProcessor, session: GpuSession) -> None:
        self.proc = proc
        self.session = session
        self.batch = proc.batch
        self.device: CudaDevice = session.device
        self.stream = session.stream
        name = proc.input_name
        self.input_ptr = session.device_inputs[name].ptr
        self.input_stride = session.inputs[name].nbytes // self.batch  # bytes of one sample
        self.output_name = proc.output_name
        out = session.outputs[self.output_name]
        self.output_ptr = session.device_outputs[self.output_name].ptr
        self.output_stride = out.nbytes // self.batch
        self.zero_copy = proc.memory_mode == "zero-copy"
        self.staging = Staging()
        # The decoder keeps scratch buffers, so each slot has its own (the host fallback uses it too).
        self.decoder: Decoder = make_decoder(proc.config.decode, proc.output_specs, session.metadata)
        self.filter: GpuCandidateFilter | None = None
        self.nms: GpuNms | None = None
        with self.device.active():
            self.events = [self.device.event() for _ in range(5)]
            self.params = self.device.pinned_empty((self.batch, BATCH_COLS), np.int64)
            self.params_dev = self.device.alloc(self.params.nbytes)
            if proc.gpu_decode:
                shape = (1, *out.shape[1:])  # one sample's output
                self.filter = GpuCandidateFilter(self.decoder, shape, self.device, proc.candidates,
                                                 mapped=self.zero_copy, batch=self.batch)
                if proc.gpu_nms:
                    self.nms = GpuNms(self.decoder, self.filter.num_classes, proc.candidates, self.batch,
                                      self.device, mapped=self.zero_copy)
        # Per-stage GPU times of the recent calls, in fixed rings (nothing grows with the run's length).
        self.gpu_times = {stage: LatencyRing() for stage in GPU_STAGES}
        self._calls = 0
        self.calls_at: dict[int, int] = {}  # engine calls by the batch size they ran at (part batches)

    def active(self) -> AbstractContextManager[object]:
        return self.device.active()

    def _stage_in(self, frames: Sequence[np.ndarray]) -> list[tuple[int, int, int]]:
        """Put the frames where the letterbox kernel reads them; ``[(device address, h, w)...]``.

        A frame decoded into one of the processor's own page-locked buffers (:meth:`GpuProcessor.frame_buffer`)
        is not copied on the host: zero-copy, the kernel reads it where it lies; pinned, it is uploaded
        straight from there. Any other frame is first copied into the slot's staging buffer. Frames sit
        packed in the device staging buffer, ``ALIGN`` apart.
        """
        from edgert.backends.cuda import copy_htod_address_pinned, copy_htod_batch_pinned  # both page-locked

        known = self.proc.frame_buffers
        plan: list[tuple[np.ndarray, int, int, int, int | None, int]] = []  # frame, h, w, offset, mapped ptr, addr
        end = 0
        for frame in frames:
            h, w = check_frame(frame)
            addr = frame.__array_interface__["data"][0]
            own = known.get(addr) if frame.flags.c_contiguous else None
            if own is not None and own[0] < frame.nbytes:
                own = None  # a larger frame than the buffer at that address was made for: not ours
            if own is not None and self.zero_copy:
                plan.append((frame, h, w, -1, own[1], addr))
                continue
            plan.append((frame, h, w, end, None if own is None else 0, addr))
            end += -(-(h * w * 3) // ALIGN) * ALIGN
        staging = self.staging
        if end:
            staging.ensure(self.device, end, self.zero_copy)
        host = staging.host
        places: list[tuple[int, int, int]] = []
        dsts: list[int] = []  # the uploads, made at the end in one driver call where the driver has one
        srcs: list[int] = []
        sizes: list[int] = []
        for frame, h, w, offset, mapped, addr in plan:
            if offset < 0:  # zero-copy, our buffer: the kernel reads the frame itself
                places.append((int(mapped or 0), h, w))
                continue
            nbytes = h * w * 3
            if mapped is None:  # someone else's array: through the staging buffer
                if host is None:  # pragma: no cover - ensure always sets it
                    raise RuntimeError("staging buffer missing")
                region = host[offset:offset + nbytes]
                np.copyto(region.reshape(h, w, 3), frame)
                addr = region.__array_interface__["data"][0]
                if not self.zero_copy:
                    dsts.append(staging.ptr + offset)
                    srcs.append(addr)
                    sizes.append(nbytes)
            else:  # our page-locked buffer, discrete GPU: one DMA straight from it
                dsts.append(staging.ptr + offset)
                srcs.append(addr)
                sizes.append(nbytes)
            places.append((staging.ptr + offset, h, w))
        if len(dsts) > 1 and copy_htod_batch_pinned(dsts, srcs, sizes, self.stream):
            return places
        for dst, src, nbytes in zip(dsts, srcs, sizes):
            copy_htod_address_pinned(dst, src, nbytes, self.stream)
        return places

    def process(self, frames: Sequence[np.ndarray], timings: Sequence[np.ndarray]) -> list[Detections]:
        """Frames through the whole GPU path, one engine call (called with the device context active)."""
        later = self.process_deferred(frames, timings)
        t0 = time.perf_counter()
        dets = later()
        spent = time.perf_counter() - t0
        for timing in timings:
            timing[_POST] += spent  # the batch's NMS and mapping are the postprocess stage too
        return dets

    def process_deferred(self, frames: Sequence[np.ndarray],
                         timings: Sequence[np.ndarray]) -> Callable[[], list[Detections]]:
        """:meth:`process` up to the batch's candidate rows, copied out of the slot's buffers; the rest (one NMS
        and one mapping for the batch) is returned as a call that any thread may make. Frames whose candidates
        overflowed are decoded here, from the whole output, before the next batch overwrites it. The pipeline
        makes the call on the slot's own thread (:mod:`edgert.pipeline.results` says why: measured)."""
        t0 = time.perf_counter()
        s = self.stream
        timed = self._calls % _TIME_EVERY == 0
        self._calls += 1
        rows = self.session.use_rows(len(frames))  # a part batch runs at its own size where the model can
        self.calls_at[rows] = self.calls_at.get(rows, 0) + 1
        ev = self.events if timed else None
        if ev:
            ev[0].record(s)
        places = self._stage_in(frames)
        if ev:
            ev[1].record(s)
        transforms = self.proc.letterbox.enqueue_batch(0, places, self.params, self.params_dev.ptr,
                                                       self.input_ptr, self.input_stride, s)
        if ev:
            ev[2].record(s)
        t1 = time.perf_counter()
        if self.nms is not None and self.filter is not None:
            # The lock is given up twice: in ONNX Runtime's run (which waits for the model itself) and in the one
            # wait for the tail (filter, NMS, the copy back of the batch's detections). Polling for the tail
            # with the lock held instead was tried on the H200 and did not pay (docs/pipeline.md).
            self.session.compute_async()
            if ev:
                ev[3].record(s)
            self.filter.enqueue(self.output_ptr, s, len(frames), copy_back=False)
            self.nms.enqueue(self.filter.counters_ptr, self.filter.buf_ptr, transforms, s)
            if ev:
                ev[4].record(s)
            s.synchronize()
            t2 = time.perf_counter()
            later = self._collect_nms(transforms)
        else:
            self.session.compute_only()  # runs on self.stream and synchronises it
            if ev:
                ev[3].record(s)
            t2 = time.perf_counter()
            if self.filter is not None:
                self.filter.enqueue(self.output_ptr, s, len(frames))
            if ev:
                ev[4].record(s)
            s.synchronize()
            later = self._collect(transforms)
        t3 = time.perf_counter()
        if ev:
            g = self.gpu_times
            g["upload"].add(ev[1].elapsed_ms(ev[0]) / 1e3)
            g["preprocess"].add(ev[2].elapsed_ms(ev[1]) / 1e3)
            g["infer"].add(ev[3].elapsed_ms(ev[2]) / 1e3)
            g["decode"].add(ev[4].elapsed_ms(ev[3]) / 1e3)
        for timing in timings:
            timing[_PRE] = t1 - t0  # host: staging copies and the enqueues (the GPU work is under gpu_ms)
            # waits for upload + letterbox + the model on this slot's stream (with gpu_nms: and the filter, NMS
            # and copy back, all behind one wait)
            timing[_INFER] = t2 - t1
            timing[_POST] = t3 - t2  # readback; process() adds the finishing call's time
        return later

    def _collect_nms(self, transforms: list[LetterboxTransform]) -> Callable[[], list[Detections]]:
        """The GPU NMS's detections of the batch; a sample whose candidates overflowed is decoded on the host."""
        assert self.nms is not None and self.filter is not None  # process_deferred's branch
        found, overflowed = self.nms.finish(len(transforms))
        if overflowed:
            self.filter.note_overflows(overflowed)
            self._decode_on_host(transforms, [k for k, d in enumerate(found) if d is None], found)
        out = [d for d in found if d is not None]
        return lambda: out

    def _collect(self, transforms: list[LetterboxTransform]) -> Callable[[], list[Detections]]:
        """Copy every sample's candidate rows out (a fixed number of numpy calls per batch); decode the samples
        that overflowed (or all, with no GPU filter) on the host now; return the call that finishes the rest."""
        out: list[Detections | None] = [None] * len(transforms)
        rows: np.ndarray | None = None
        owner: np.ndarray | None = None
        done: list[int] = []
        if self.filter is not None:
            rows, owner, overflowed = self.filter.rows_batch(len(transforms))
            done = np.flatnonzero(~overflowed).tolist()  # overflowed ones: decoded on the host below
            if len(done) < len(transforms):
                owner = (np.cumsum(~overflowed) - 1)[owner]  # positions among the samples that fit
        if len(done) < len(transforms):
            # Host decoding from the whole output (no GPU filter for this layout, or a buffer overflowed).
            skip = set(done)
            self._decode_on_host(transforms, [k for k in range(len(transforms)) if k not in skip], out)
        decoder = self.decoder  # its batch finish keeps no scratch: safe beside this thread's host decoding

        def finish() -> list[Detections]:
            if done and rows is not None and owner is not None:
                found = finish_candidates(rows, owner, decoder, [transforms[k] for k in done])
                for k, d in zip(done, found):
                    out[k] = d
            return [d for d in out if d is not None]

        return finish

    def _decode_on_host(self, transforms: list[LetterboxTransform], samples: list[int],
                        out: list[Detections | None]) -> None:
        """Decode ``samples`` of the batch on the host from the whole output, into ``out``."""
        from edgert.backends.cuda import copy_dtoh_async

        host = self.session.outputs[self.output_name]
        copy_dtoh_async(host, self.output_ptr, self.stream)
        self.stream.synchronize()
        for k in samples:
            sample = self.session.outputs if self.batch == 1 else {
                n: v[k:k + 1] for n, v in self.session.outputs.items()}
            out[k] = self.decoder(sample, transforms[k])

    def close(self) -> None:
        with self.device.active():
            if self.nms is not None:
                self.nms.close()
            if self.filter is not None:
                self.filter.close()
            self.staging.free()
            self.params_dev.free()
        self.session.close()


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
