"""The streaming pipeline: capture -> preprocess -> infer -> postprocess -> sinks, one thread per stage.

Why threads and queues: the engine is the expensive part, so everything else (decoding video,
letterboxing, decoding boxes, drawing, encoding outputs) must happen *while* the engine runs, not
between its calls. Each stage runs on its own thread; they hand frames along in bounded queues.
OpenCV, numpy and the inference runtimes release the GIL in their heavy calls, so the stages really do
overlap.

Why rings of buffers: nothing is allocated per frame once the pipeline is warm.

- a fixed set of *slots* (``runtime.queue_size``, at least 3) carries frames through the stages; each slot owns a frame
  buffer the source decodes into, and preallocated copies of the model outputs. A slot goes back to
  the free list after the sinks took the frame, so the capture stage can only run ``len(slots)``
  frames ahead: that is the back-pressure for files (live sources drop stale frames instead);
- a fixed ring of two *input buffers* (the model's input tensor): preprocessing writes into
  a free one, the infer stage copies it into the session's bound input with ``np.copyto`` and returns
  it to the free list at once, then runs the engine. Outputs are copied into the slot before the next
  ``infer()`` overwrites them.

Stopping: end of input, ``max_frames``, :meth:`Pipeline.request_stop` (SIGINT/SIGTERM call it) all let
the frames in flight finish and flush the sinks; an error in any stage (or a second signal) aborts.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import ConfigError
from edgert.pipeline.observer import PipelineObserver
from edgert.pipeline.stats import STAGES, PipelineStats

__all__ = ["Pipeline", "run_pipeline"]

log = logging.getLogger(__name__)

_CAPTURE, _PRE, _INFER, _POST, _SINKS, _TOTAL = range(len(STAGES))
_POLL = 0.1  # seconds a blocked stage waits before it checks for an abort
INPUT_BUFFERS = 2


@dataclass(eq=False)
class _Slot:
    """One frame in flight and the buffers it owns."""

    frame: np.ndarray | None = None
    input: np.ndarray | None = None
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    transform: Any = None
    index: int = 0
    timestamp: float = 0.0
    started: float = 0.0
    file: str | None = None
    timings: np.ndarray = field(default_factory=lambda: np.zeros(len(STAGES), np.float64))


class Pipeline:
    """One model on one source, feeding any number of sinks.

    ``config`` says everything (model, preprocessing, decoding, source, sinks, runtime). ``source``,
    ``sinks`` and ``detector`` may be given as objects instead (tests, applications, benchmarks).
    ``admit`` is called in the capture stage before each frame is admitted: a power-budget controller
    blocks inside it to pace the pipeline. ``observers`` see start, every frame, and stop.
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        source: Any = None,
        sinks: Sequence[Any] | None = None,
        detector: Any = None,
        observers: Sequence[PipelineObserver] = (),
        admit: Callable[[], None] | None = None,
        handle_signals: bool = True,
    ) -> None:
        self.config = config
        self._source = source
        self._sink_specs = list(sinks) if sinks is not None else list(config.sinks)
        self._detector = detector
        self._owns_detector = detector is None
        self.observers: list[PipelineObserver] = list(observers)
        self.admit = admit
        self.handle_signals = handle_signals
        self.stats = PipelineStats()
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._errors: list[BaseException] = []
        self._stopped_by = "end of input"
        self._class_counts: dict[int, int] = {}
        self._names: tuple[str, ...] = ()
        self._workers: list[Any] = []
        self._info: dict[str, Any] = {}
        self.input_ring: tuple[np.ndarray, ...] = ()
        self.slots: tuple[_Slot, ...] = ()
        self.used_input_buffers: set[int] = set()  # ids of the buffers preprocessing wrote (tests check reuse)
        self.frame_buffer_allocations = 0  # frames the source could not decode into a slot's own buffer

    # -- control ------------------------------------------------------------------------------------
    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop admitting frames; frames in flight finish and sinks flush. Safe from any thread."""
        if not self._stop.is_set():
            self._stopped_by = reason
            self._stop.set()
            if self._source is not None:
                self._source.stop()
            # Observers that care hear it now, before the flush (systemd wants STOPPING=1 at SIGTERM).
            for observer in list(self.observers):
                hook = getattr(observer, "on_stop_requested", None)
                if hook is not None:
                    try:
                        hook(reason)
                    except Exception:  # an observer must never break stopping
                        log.warning("observer %r failed on stop request", observer, exc_info=True)

    def abort(self, reason: str = "aborted") -> None:
        """Stop now, dropping frames in flight."""
        self.request_stop(reason)
        self._abort.set()

    def _fail(self, exc: BaseException) -> None:
        self._errors.append(exc)
        self.abort("error")

    # -- running ------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run until the input ends, ``max_frames`` is reached or a stop is requested; return the summary."""
        from edgert.vision.detector import Detector
        from edgert.vision.sources import open_source

        started = time.perf_counter()
        if self._detector is None:
            model = self.config.model.path
            if not model:
                raise ConfigError("no model given. Note: pass --model PATH or set model.path in the config")
            self._detector = Detector(model, self.config, backend=self.config.model.backend)
        detector = self._detector
        try:
            self._names = tuple(detector.names)
            for _ in range(self.config.runtime.warmup):
                detector.session.infer()
            if self._source is None:
                self._source = open_source(self.config.source)
            source = self._source
            with source:
                self._open_sinks(source, detector)
                try:
                    self._allocate(detector)
                    self._info = self._start_info(source, detector)
                    self._run_threads(source, detector)
                finally:
                    for worker in self._workers:
                        worker.close()
        finally:
            if self._owns_detector:
                detector.close()
        summary = self.summary(time.perf_counter() - started)
        self._notify("on_stop", summary)
        if self._errors:
            raise self._errors[0]
        return summary

    def _open_sinks(self, source: Any, detector: Any) -> None:
        from edgert.vision.sinks import StreamInfo, open_sinks, prepare_sinks

        title = f"{_basename(self.config.model.path)} on {source.uri}"
        info = StreamInfo(source.width, source.height, source.fps, self._names, title, self.stats)
        # Every sink checked, locked and bound before any truncates its file: a run that cannot start
        # leaves existing outputs alone. A sink failing mid-run stops the run with its error.
        sinks = prepare_sinks(self._sink_specs, title)
        self._workers = open_sinks(sinks, info, on_failure=self._sink_failed)

    def _sink_failed(self, worker: Any) -> None:
        self._errors.append(worker.error)
        self.request_stop("sink failed")

    def _allocate(self, detector: Any) -> None:
        # Two input buffers keep the engine fed: one ready for the next infer() while preprocessing
        # fills the other. More would only add latency.
        buf = detector.session.inputs[detector.input_name]
        self.input_ring = tuple(np.zeros_like(buf) for _ in range(INPUT_BUFFERS))
        # Frames in flight: enough for every stage to hold one; each one more adds one frame of latency.
        outputs = detector.session.outputs
        count = max(3, self.config.runtime.queue_size)
        self.slots = tuple(
            _Slot(outputs={name: np.zeros_like(arr) for name, arr in outputs.items()}) for _ in range(count)
        )

    def _start_info(self, source: Any, detector: Any) -> dict[str, Any]:
        session = detector.session
        return {
            "task": self.config.task,
            "model": self.config.model.path,
            "backend": session.backend_name,
            "input": {"name": detector.input_name, "shape": list(session.inputs[detector.input_name].shape),
                      "dtype": str(session.inputs[detector.input_name].dtype)},
            "classes": len(self._names),
            "source": source.uri,
            "source_info": source.info(),
            "stats": self.stats,  # the live PipelineStats, for observers that read it later (metrics)
            "sinks": [w.sink.uri for w in self._workers],
            "input_buffers": len(self.input_ring),
            "slots": len(self.slots),
        }

    def _run_threads(self, source: Any, detector: Any) -> None:
        n = len(self.slots)
        self._free_slots: queue.Queue[_Slot] = queue.Queue(maxsize=n)
        for slot in self.slots:
            self._free_slots.put(slot)
        self._free_inputs: queue.Queue[np.ndarray] = queue.Queue(maxsize=len(self.input_ring))
        for buf in self.input_ring:
            self._free_inputs.put(buf)
        # Queues are bounded by the slot count: a put never blocks, the slots are the back-pressure.
        q_pre: queue.Queue[_Slot | None] = queue.Queue(maxsize=n + 1)
        q_infer: queue.Queue[_Slot | None] = queue.Queue(maxsize=n + 1)
        q_post: queue.Queue[_Slot | None] = queue.Queue(maxsize=n + 1)
        stages = [
            ("capture", self._capture, (source, q_pre)),
            ("preprocess", self._preprocess, (detector, q_pre, q_infer)),
            ("infer", self._infer, (detector, q_infer, q_post)),
            ("postprocess", self._postprocess, (detector, q_post, source)),
        ]
        threads = [
            threading.Thread(target=self._guard, args=(fn, args), name=f"edgert-{name}", daemon=True)
            for name, fn, args in stages
        ]
        restore = self._install_signals()
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():  # join in slices so the main thread still runs signal handlers
                    t.join(0.2)
        finally:
            restore()

    def _guard(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # any stage's failure stops the whole pipeline and is re-raised by run()
            self._fail(exc)

    def _install_signals(self) -> Callable[[], None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None

        first_at: list[float] = []

        def handler(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            now = time.monotonic()
            if not first_at:
                first_at.append(now)
                log.warning("%s: finishing the frames in flight, then stopping", name)
                self.request_stop(name)
            elif now - first_at[0] > 0.5:  # a copy of the same signal (e.g. sent to the process group) is not
                log.warning("%s again: stopping now", name)  # a second request
                self.abort(name)

        old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for sig, h in old.items():
                signal.signal(sig, h)

        return restore

    def _get(self, q: queue.Queue[Any]) -> Any:
        """Next item of ``q``; None when the pipeline aborts."""
        while True:
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                if self._abort.is_set():
                    return None

    # -- stages -------------------------------------------------------------------------------------
    def _capture(self, source: Any, out: queue.Queue[_Slot | None]) -> None:
        limit = self.config.runtime.max_frames
        index = 0
        try:
            while not self._stop.is_set():
                if limit is not None and index >= limit:
                    self._stopped_by = "max_frames"
                    break
                if self.admit is not None:
                    self.admit()
                    if self._stop.is_set():
                        break
                slot = self._get(self._free_slots)
                if slot is None:
                    break
                t0 = time.perf_counter()
                frame = source.read(slot.frame)
                if frame is None:
                    self._free_slots.put(slot)
                    break
                if frame is not slot.frame:
                    slot.frame = frame  # the slot keeps this buffer for its next frames
                    self.frame_buffer_allocations += 1
                slot.started = t0
                slot.timestamp = time.time()
                slot.index = index
                current = getattr(source, "current", None)
                slot.file = None if current is None else str(current)
                slot.timings[_CAPTURE] = time.perf_counter() - t0
                if index == 0:
                    self.stats.mark_started()
                index += 1
                out.put(slot)
        finally:
            out.put(None)

    def _preprocess(self, detector: Any, inq: queue.Queue[_Slot | None], out: queue.Queue[_Slot | None]) -> None:
        preprocessor = detector.preprocessor
        try:
            while True:
                slot = self._get(inq)
                if slot is None:
                    break
                buf = self._get(self._free_inputs)
                if buf is None:
                    break
                t0 = time.perf_counter()
                slot.transform = preprocessor(slot.frame, buf)
                slot.input = buf
                self.used_input_buffers.add(id(buf))
                slot.timings[_PRE] = time.perf_counter() - t0
                out.put(slot)
        finally:
            out.put(None)

    def _infer(self, detector: Any, inq: queue.Queue[_Slot | None], out: queue.Queue[_Slot | None]) -> None:
        session = detector.session
        target = session.inputs[detector.input_name]
        try:
            while True:
                slot = self._get(inq)
                if slot is None:
                    break
                t0 = time.perf_counter()
                buf = slot.input
                np.copyto(target, buf)
                slot.input = None
                self._free_inputs.put(buf)  # preprocessing may refill it while the engine runs
                outputs = session.infer()
                for name, value in outputs.items():
                    mine = slot.outputs.get(name)
                    if mine is not None and mine.shape == value.shape:
                        np.copyto(mine, value)
                    else:  # outputs whose size follows the data (NMS in the graph)
                        slot.outputs[name] = value.copy()
                slot.timings[_INFER] = time.perf_counter() - t0
                out.put(slot)
        finally:
            out.put(None)

    def _postprocess(self, detector: Any, inq: queue.Queue[_Slot | None], source: Any) -> None:
        from edgert.vision.draw import draw_detections
        from edgert.vision.sinks import FrameResult

        decoder = detector.decoder
        workers = self._workers
        draw = any(w.sink.needs_image for w in workers)
        first = True
        while True:
            slot = self._get(inq)
            if slot is None:
                break
            t0 = time.perf_counter()
            detections = decoder(slot.outputs, slot.transform)
            t1 = time.perf_counter()
            slot.timings[_POST] = t1 - t0
            if workers:
                if draw:
                    draw_detections(slot.frame, detections)
                result = FrameResult(slot.index, slot.timestamp, detections, slot.frame if draw else None, slot.file)
                for worker in workers:
                    worker.offer(result)
            done = time.perf_counter()
            slot.timings[_SINKS] = done - t1
            slot.timings[_TOTAL] = done - slot.started
            for cid in detections.class_id.tolist():
                self._class_counts[cid] = self._class_counts.get(cid, 0) + 1
            self.stats.record_frame(slot.timings, len(detections))
            self._update_drops(source)
            self._free_slots.put(slot)
            if first:
                first = False
                self._notify("on_start", self._info)
            self._notify("on_frame", self.stats)

    def _update_drops(self, source: Any) -> None:
        stats = self.stats
        if source.live:
            stats.set_drops("stale_frames", source.dropped)
        if source.skipped:
            stats.set_drops("corrupt_frames", source.skipped)
        for worker in self._workers:
            if worker.dropped:
                stats.set_drops(f"sink:{worker.sink.uri}", worker.dropped)

    def _notify(self, method: str, arg: Any) -> None:
        for observer in list(self.observers):
            try:
                getattr(observer, method)(arg)
            except Exception as exc:  # an observer must not take the pipeline down
                log.error("observer %s failed in %s and is removed: %s", type(observer).__name__, method, exc)
                self.observers.remove(observer)

    # -- results ------------------------------------------------------------------------------------
    def summary(self, wall_s: float | None = None) -> dict[str, Any]:
        """What ``edgert run --json`` prints: frames, FPS, per-stage latency, drops, detections per class."""
        stats = self.stats
        source = self._source
        if source is not None:
            self._update_drops(source)
        names = self._names
        per_class = {
            (names[cid] if 0 <= cid < len(names) else str(cid)): n
            for cid, n in sorted(self._class_counts.items(), key=lambda kv: -kv[1])
        }
        summary: dict[str, Any] = {
            "model": self.config.model.path,
            "backend": self._info.get("backend"),
            "source": source.info() if source is not None else None,
            "sinks": [w.sink.uri for w in self._workers],
            "frames": stats.frames,
            "fps": round(stats.average_fps, 2),
            "latency_ms": stats.latency_ms(),
            "dropped": stats.dropped,
            "drops": dict(stats.drops),
            "reconnects": getattr(source, "reconnects", 0),
            "detections": stats.detections,
            "detections_per_class": per_class,
            "stopped_by": self._stopped_by,
            "input_buffers": len(self.input_ring),
        }
        if stats.watts is not None:
            summary["watts"] = round(float(stats.watts), 3)
        if wall_s is not None:
            summary["wall_s"] = round(wall_s, 3)
        if self._errors:
            summary["error"] = str(self._errors[0])
        return summary


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1] or "model"


def run_pipeline(config: PipelineConfig, **kwargs: Any) -> dict[str, Any]:
    """``Pipeline(config, **kwargs).run()``."""
    return Pipeline(config, **kwargs).run()
