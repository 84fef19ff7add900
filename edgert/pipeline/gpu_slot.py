"""A slot of the GPU processor (:mod:`edgert.pipeline.gpu`): one GPU session with its own CUDA stream, staging,
device buffers and candidate buffer, driven by one pipeline thread; the steps a batch takes are listed there."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import numpy as np

from edgert.pipeline.gpu_memory import ALIGN, Staging
from edgert.pipeline.processor import ProcessorSlot
from edgert.stats import STAGES, LatencyRing
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.detections import Detections
from edgert.vision.gpu_decode import GpuCandidateFilter, finish_candidates
from edgert.vision.gpu_nms import GpuNms
from edgert.vision.gpu_preprocess import BATCH_COLS
from edgert.vision.preprocess import LetterboxTransform, check_frame

if TYPE_CHECKING:
    from edgert.backends.cuda import CudaDevice
    from edgert.backends.gpu_session import GpuSession
    from edgert.config import PipelineConfig
    from edgert.types import TensorSpec
    from edgert.vision.gpu_preprocess import GpuLetterbox

__all__ = ["GPU_STAGES", "GpuSlot", "SlotOwner"]

GPU_STAGES = ("upload", "preprocess", "infer", "decode")
_PRE, _INFER, _POST = STAGES.index("preprocess"), STAGES.index("infer"), STAGES.index("postprocess")
#: The per-stage GPU times are taken on one batch in this many: each event record or read is a driver call made
#: with the interpreter lock held (nine per timed batch), and the rings are quantiles of a sample anyway.
_TIME_EVERY = 8


class SlotOwner(Protocol):
    """What a slot reads of the GPU processor that made it (:class:`edgert.pipeline.gpu.GpuProcessor`)."""

    @property
    def batch(self) -> int: ...
    @property
    def candidates(self) -> int: ...
    @property
    def config(self) -> PipelineConfig: ...
    @property
    def gpu_decode(self) -> bool: ...
    @property
    def gpu_nms(self) -> bool: ...
    @property
    def input_name(self) -> str: ...
    @property
    def memory_mode(self) -> str: ...
    @property
    def output_name(self) -> str: ...
    @property
    def output_specs(self) -> list[TensorSpec]: ...
    @property
    def frame_buffers(self) -> dict[int, tuple[int, int]]: ...
    @property
    def letterbox(self) -> GpuLetterbox: ...


class GpuSlot(ProcessorSlot):
    """One session + stream + buffers for ``batch`` frames per call; used by exactly one pipeline thread.

    A batch costs the same number of CUDA calls as one frame: the frames are packed into one staging
    buffer (one upload), one letterbox launch makes every sample of the batched input (their geometry in
    one small table), and one filter launch and one copy bring every sample's candidates back.
    """

    def __init__(self, proc: SlotOwner, session: GpuSession) -> None:
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
