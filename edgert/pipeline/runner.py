"""The one streaming pipeline: admission -> a processor's slots -> results in order -> sinks.

Why threads and queues: the engine is the expensive part, so everything else (decoding video,
letterboxing, decoding boxes, drawing, encoding outputs) must happen *while* the engine runs, not
between its calls. OpenCV, numpy and the inference runtimes release the GIL in their heavy calls, so the
threads really do overlap.

- the **capture** thread admits frames: it waits for the power budget (``admit``), takes a free frame
  buffer and has the source decode into it;
- one thread per **processor slot** (:mod:`edgert.pipeline.processor`: CPU or GPU) takes the next admitted
  frame and turns it into detections on that slot's own session, so several frames are in flight at once;
- the **results** thread puts frames back in order, draws them when a sink wants pixels, hands them to the
  sinks, records the statistics and tells the observers; then the frame buffer is free again.

Why a ring of frame buffers: nothing is allocated per frame once the pipeline is warm. A fixed set of frames
(``max(runtime.queue_size, 2 x slots)``) carries the pixels through the stages, so the capture thread can run
only that far ahead: that is the back-pressure for files (live sources drop stale frames instead). Sinks
that write files (``Sink.lossless``) never drop a frame; they slow the pipeline down instead.

Stopping: end of input, ``max_frames``, :meth:`Pipeline.request_stop` (SIGINT/SIGTERM call it) all let
the frames in flight finish and flush the sinks; an error in any stage, or a second signal, aborts within
a fraction of a second.
"""

from __future__ import annotations

import dataclasses
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

_CAPTURE, _SINKS, _TOTAL = STAGES.index("capture"), STAGES.index("sinks"), STAGES.index("total")
_POLL = 0.1  # seconds a blocked stage waits before it checks for an abort
_ABORT_GRACE_S = 1.0  # after an abort, how long run() waits for a thread stuck in a source or a driver


@dataclass(eq=False)
class _Frame:
    """One frame in flight and the pixel buffer it owns."""

    pixels: np.ndarray | None = None
    detections: Any = None
    index: int = 0
    timestamp: float = 0.0
    started: float = 0.0
    file: str | None = None
    timings: np.ndarray = field(default_factory=lambda: np.zeros(len(STAGES), np.float64))


class Pipeline:
    """One model on one source, feeding any number of sinks, on the CPU or the GPU processor.

    ``config`` says everything (model, preprocessing, decoding, source, sinks, runtime, power). ``source``,
    ``sinks``, ``detector`` (an open :class:`~edgert.vision.detector.Detector` for the CPU processor) and
    ``processor`` may be given as objects instead (tests, applications, benchmarks). ``admit`` is called in
    the capture stage before each frame is admitted (a power-budget controller blocks inside it; with
    ``power.budget_w`` the pipeline makes one itself). ``observers`` see start, every frame, and stop.
    ``environment``: also attach what the process environment asks for (systemd's ``NOTIFY_SOCKET``).
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        source: Any = None,
        sinks: Sequence[Any] | None = None,
        detector: Any = None,
        processor: Any = None,
        observers: Sequence[PipelineObserver] = (),
        admit: Callable[[], None] | None = None,
        handle_signals: bool = True,
        environment: bool = True,
    ) -> None:
        self.config = config
        self._source = source
        self._sink_specs = list(sinks) if sinks is not None else list(config.sinks)
        self._detector = detector
        self._processor = processor
        self._owns_processor = processor is None
        self.observers: list[PipelineObserver] = list(observers)
        self.admit = admit
        self.handle_signals = handle_signals
        self.environment = environment
        self.stats = PipelineStats()
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._errors: list[BaseException] = []
        self._stopped_by = "end of input"
        self._class_counts: dict[int, int] = {}
        self._names: tuple[str, ...] = ()
        self._workers: list[Any] = []
        self._info: dict[str, Any] = {}
        self._hooks: Any = None
        self.frames: tuple[_Frame, ...] = ()
        self.frame_buffer_allocations = 0  # frames the source could not decode into a frame's own buffer

    @property
    def processor(self) -> Any:
        """The processor of this run (None before :meth:`run` opened it)."""
        return self._processor

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
        from edgert.pipeline.hooks import RunHooks
        from edgert.pipeline.processor import open_processor

        started = time.perf_counter()
        if self._processor is None and self._detector is None and not self.config.model.path:
            raise ConfigError("no model given. Note: pass --model PATH or set model.path in the config")
        # What can fail to start (a budget without a meter, a metrics port in use) fails before anything opens.
        self._hooks = RunHooks(self.config, self.config.model.path, environment=self.environment)
        try:
            if self.admit is None:
                self.admit = self._hooks.admit
            self.observers = [*self._hooks.observers, *self.observers]
            if self._processor is None:
                self._processor = open_processor(self.config, detector=self._detector)
            processor = self._processor
            try:
                self._names = tuple(processor.names)
                processor.warm_up(self.config.runtime.warmup)
                if self._source is None:
                    self._source = self._open_source()
                source = self._source
                with source:
                    self._open_sinks(source)
                    try:
                        self._allocate(processor)
                        self._info = self._start_info(source, processor)
                        self._run_threads(source, processor)
                    finally:
                        for worker in self._workers:
                            worker.close()
                    summary = self.summary(time.perf_counter() - started)  # sinks flushed, processor open
            finally:
                if self._owns_processor:
                    processor.close()
        finally:
            power = self._hooks.power_summary() if self._hooks is not None else None
            self._hooks.close()
        if power is not None:
            summary["power"] = power
            summary["watts"] = power.get("avg_w")
            summary["mj_per_frame"] = power.get("mj_per_frame")
        self._notify("on_stop", summary)
        if self._errors:
            raise self._errors[0]
        return summary

    def _open_source(self) -> Any:
        from edgert.vision.sources import open_source

        cfg = self.config.source
        if not cfg.preload:
            return open_source(cfg)
        from edgert.pipeline.preload import PreloadedSource

        # The file itself is read once; looping happens over the frames in memory.
        inner = open_source(dataclasses.replace(cfg, loop=False, preload=False))
        return PreloadedSource(inner, self.config.runtime.max_frames if not cfg.loop else None, loop=cfg.loop)

    def _open_sinks(self, source: Any) -> None:
        from edgert.vision.sinks import SinkWorker, StreamInfo, open_sink

        title = f"{_basename(self.config.model.path)} on {source.uri}"
        info = StreamInfo(source.width, source.height, source.fps, self._names, title, self.stats)
        for spec in self._sink_specs:
            try:
                sink = open_sink(spec, title) if isinstance(spec, str) else spec
                sink.open(info)
            except BaseException:
                for worker in self._workers:
                    worker.close()
                self._workers = []
                raise
            worker = SinkWorker(sink)
            worker.start()
            self._workers.append(worker)

    def _allocate(self, processor: Any) -> None:
        # Enough frames for every slot to hold one while the capture fills the next and the sinks take the last;
        # each one more adds one frame of latency.
        count = max(self.config.runtime.queue_size, 2 * len(processor.slots))
        self.frames = tuple(_Frame() for _ in range(count))

    def _start_info(self, source: Any, processor: Any) -> dict[str, Any]:
        return {
            "task": self.config.task,
            "model": self.config.model.path,
            "backend": processor.backend_name,
            "processing": processor.kind,
            "input": {"name": processor.input_name, "shape": list(processor.input_shape),
                      "dtype": processor.input_dtype},
            "classes": len(self._names),
            "source": source.uri,
            "source_info": source.info(),
            "stats": self.stats,  # the live PipelineStats, for observers that read it later (metrics)
            "sinks": [w.sink.uri for w in self._workers],
            "slots": len(processor.slots),
            "frames_in_flight": len(self.frames),
        }

    def _run_threads(self, source: Any, processor: Any) -> None:
        n = len(self.frames)
        self._free: queue.Queue[_Frame] = queue.Queue(maxsize=n)
        for f in self.frames:
            self._free.put(f)
        # Queues are bounded by the frame count plus their end markers: a put never blocks.
        lanes = len(processor.slots)
        q_work: queue.Queue[_Frame | None] = queue.Queue(maxsize=n + lanes)
        q_done: queue.Queue[_Frame | None] = queue.Queue(maxsize=n + lanes)
        stages: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = [
            ("capture", self._capture, (source, q_work, lanes)),
        ]
        stages += [(f"slot{k}", self._slot, (processor, slot, q_work, q_done))
                   for k, slot in enumerate(processor.slots)]
        stages.append(("results", self._results, (q_done, lanes, source)))
        threads = [
            threading.Thread(target=self._guard, args=(fn, args), name=f"edgert-{name}", daemon=True)
            for name, fn, args in stages
        ]
        restore = self._install_signals()
        if self._hooks is not None:
            self._hooks.begin()
        try:
            for t in threads:
                t.start()
            aborted_at: float | None = None
            for t in threads:
                while t.is_alive():  # join in slices so the main thread still runs signal handlers
                    t.join(0.1)
                    if self._abort.is_set():
                        aborted_at = aborted_at or time.monotonic()
                        if time.monotonic() - aborted_at > _ABORT_GRACE_S:
                            log.warning("thread %s did not stop in time; leaving it", t.name)
                            break
        finally:
            if self._hooks is not None:
                self._hooks.end()
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
    def _capture(self, source: Any, out: queue.Queue[_Frame | None], lanes: int) -> None:
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
                f = self._get(self._free)
                if f is None:
                    break
                t0 = time.perf_counter()
                pixels = source.read(f.pixels)
                if pixels is None:
                    self._free.put(f)
                    reason = getattr(source, "end_reason", None)
                    if reason and not self._stop.is_set():
                        self._stopped_by = str(reason)
                    break
                if pixels is not f.pixels:
                    f.pixels = pixels  # the frame keeps this buffer for its next images
                    self.frame_buffer_allocations += 1
                f.started = t0
                f.timestamp = time.time()
                f.index = index
                current = getattr(source, "current", None)
                f.file = None if current is None else str(current)
                f.timings[_CAPTURE] = time.perf_counter() - t0
                if index == 0:
                    self.stats.mark_started()
                index += 1
                out.put(f)
        finally:
            for _ in range(lanes):  # one end marker per slot thread
                out.put(None)

    def _slot(self, processor: Any, slot: Any, inq: queue.Queue[_Frame | None],
              out: queue.Queue[_Frame | None]) -> None:
        try:
            with slot.active():
                processor.prepare(slot)
                while True:
                    f = self._get(inq)
                    if f is None:
                        break
                    f.detections = slot.process(f.pixels, f.timings)
                    out.put(f)
        finally:
            out.put(None)

    def _results(self, inq: queue.Queue[_Frame | None], lanes: int, source: Any) -> None:
        from edgert.vision.draw import draw_detections
        from edgert.vision.sinks import FrameResult

        workers = self._workers
        draw = any(w.sink.needs_image for w in workers)
        pending: dict[int, _Frame] = {}  # frames that finished before an earlier one (several slots)
        following = 0
        ended = 0
        first = True
        while ended < lanes:
            f = self._get(inq)
            if f is None:
                if self._abort.is_set():
                    return
                ended += 1
                continue
            pending[f.index] = f
            while following in pending:
                f = pending.pop(following)
                following += 1
                t1 = time.perf_counter()
                detections = f.detections
                if workers:
                    if draw and f.pixels is not None:
                        draw_detections(f.pixels, detections)
                    result = FrameResult(f.index, f.timestamp, detections, f.pixels if draw else None, f.file)
                    for worker in workers:
                        worker.offer(result, abort=self._abort)
                done = time.perf_counter()
                f.timings[_SINKS] = done - t1
                f.timings[_TOTAL] = done - f.started
                for cid in detections.class_id.tolist():
                    self._class_counts[cid] = self._class_counts.get(cid, 0) + 1
                self.stats.record_frame(f.timings, len(detections))
                self._update_drops(source)
                f.detections = None
                self._free.put(f)
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
        """What ``edgert run --json`` prints, the same for both processors: frames, FPS, per-stage latency,
        drops by reason, detections per class, why it stopped; the GPU processor adds ``gpu_ms``."""
        stats = self.stats
        source = self._source
        if source is not None:
            self._update_drops(source)
        names = self._names
        per_class = {
            (names[cid] if 0 <= cid < len(names) else str(cid)): n
            for cid, n in sorted(self._class_counts.items(), key=lambda kv: -kv[1])
        }
        processor = self._processor
        summary: dict[str, Any] = {
            "model": self.config.model.path,
            "backend": self._info.get("backend"),
            "processing": getattr(processor, "kind", None),
            "processor": processor.describe() if processor is not None else None,
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
            "slots": len(processor.slots) if processor is not None else 0,
            "frames_in_flight": len(self.frames),
            "watts": None if stats.watts is None else round(float(stats.watts), 3),
            "mj_per_frame": None,
        }
        gpu = processor.stage_summary() if processor is not None else None
        if gpu is not None:
            summary["gpu_ms"] = gpu
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
