"""The one streaming pipeline: sources -> admission and batching -> a processor's slots -> results in order -> sinks.

Why threads and queues: the engine is the expensive part, so everything else (decoding video,
letterboxing, decoding boxes, drawing, encoding outputs) must happen *while* the engine runs, not
between its calls. OpenCV, numpy and the inference runtimes release the GIL in their heavy calls, so the
threads really do overlap.

- one **capture** thread per source admits its frames: it waits for the power budget (``admit``), takes a
  free frame buffer of that source and has the source decode into it (live sources keep only their newest
  frame; files deliver every one); file sources decoded by worker processes share one thread instead
  (:mod:`edgert.pipeline.collector`);
- the **batcher** gathers the frames that are ready into batches of at most ``runtime.batch`` (default: one
  per source), round-robin over the sources so a fast one cannot starve a slow one, waiting at most
  ``runtime.batch_timeout_ms`` for stragglers while a batch is in flight;
- one thread per **processor slot** (:mod:`edgert.pipeline.processor`: CPU or GPU) takes the next batch and
  turns it into detections in one engine call on that slot's own session, so several batches are in flight;
- the **results** thread puts frames back in order, draws them when a sink wants pixels, hands them to the
  sinks (shared ones, and each source's own), records the statistics (also per source) and tells the
  observers; then the frame buffer is free again.

A source that fails in a run with several (a camera unplugged for good, a file that vanished) drops out and
the others go on; the summary says what happened to it. With one source its failure stops the run. A source
that cannot open at start is treated the same way (:mod:`edgert.pipeline.startup`): the run starts with the
others and fails only when none opens.

Why a ring of frame buffers: nothing is allocated per frame once the pipeline is warm. A fixed set of frames
per source (:mod:`edgert.pipeline.frames` says how many) carries the pixels through the stages, so the capture can
run only that far ahead: that is the back-pressure for files (live sources drop stale frames instead). Sinks
that write files (``Sink.lossless``) never drop a frame; they slow the pipeline down instead.

Stopping: end of input, ``max_frames``, :meth:`Pipeline.request_stop` (SIGINT/SIGTERM call it) all let
the frames in flight finish and flush the sinks; an error in any stage, or a second signal, aborts within
a fraction of a second. The signal handlers are in place from the start of :meth:`Pipeline.run` until the
last sink has closed: a signal before the sinks open leaves every output untouched, and a second one while
they close still finalises the files (network sinks close first and stop waiting). A graceful stop has a
deadline (:mod:`edgert.pipeline.limits`), past which what is in flight is dropped, counted.

What flows through the stages (frames, batches, each source's feed) is :mod:`edgert.pipeline.feeds`; the summary a
run returns is built by :mod:`edgert.pipeline.summary`. Steps that run once or once per frame are beside this
module, which only moves frames between threads: opening the sinks (:mod:`edgert.pipeline.sinks`), the frame
ring (:mod:`edgert.pipeline.frames`), each frame's last step (:mod:`edgert.pipeline.finish`) and the signal
handlers (:mod:`edgert.pipeline.signals`).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from edgert.config import PipelineConfig
from edgert.errors import Aborted, ConfigError
from edgert.pipeline.feeds import _Batch, _Feed, _Frame
from edgert.pipeline.observer import PipelineObserver
from edgert.pipeline.startup import make_feeds, open_run_processor
from edgert.pipeline.state import RunState
from edgert.pipeline.summary import run_summary, start_info
from edgert.stats import PipelineStats

if TYPE_CHECKING:
    from edgert.pipeline.hooks import RunHooks
    from edgert.pipeline.limits import StopDeadline
    from edgert.pipeline.parts import JSONDict, PipelineSource, SinkSpec
    from edgert.pipeline.processor import Processor, ProcessorSlot
    from edgert.vision.detector import Detector

__all__ = ["Pipeline"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_POLL = 0.1  # seconds a blocked stage waits before it checks for an abort
_ABORT_GRACE_S = 1.0  # after an abort, how long run() waits for a thread stuck in a source or a driver


class Pipeline:
    """One model on one or several sources, feeding any number of sinks, on the CPU or the GPU processor.

    ``config`` says everything (model, preprocessing, decoding, source or sources, sinks, runtime, power).
    ``source`` (or ``sources``), ``sinks``, ``detector`` (an open :class:`~edgert.vision.detector.Detector` for
    the CPU processor) and ``processor`` may be given as objects instead (tests, applications, benchmarks).
    ``admit`` is called in the capture stage before each frame is admitted (a power-budget controller blocks
    inside it; with ``power.budget_w`` the pipeline makes one itself). ``observers`` see start, every frame,
    and stop. ``environment``: also attach what the process environment asks for (systemd's ``NOTIFY_SOCKET``).
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        source: PipelineSource | None = None,
        sources: Sequence[PipelineSource] | None = None,
        sinks: Sequence[SinkSpec] | None = None,
        detector: Detector | None = None,
        processor: Processor | None = None,
        observers: Sequence[PipelineObserver] = (),
        admit: Callable[[], None] | None = None,
        handle_signals: bool = True,
        environment: bool = True,
    ) -> None:
        self.config = config
        given = list(sources) if sources is not None else ([source] if source is not None else [])
        self._given_sources = given
        self._detector = detector
        self._owns_processor = processor is None
        self.observers: list[PipelineObserver] = list(observers)
        self.admit = admit
        self.handle_signals = handle_signals
        self.environment = environment
        self.stats = PipelineStats()
        #: what the steps beside the runner share with it (edgert.pipeline.state): feeds, sinks, errors, ...
        self.state = RunState(config, self.stats, list(sinks) if sinks is not None else list(config.sinks),
                              self.request_stop, self.abort, self._notify, processor=processor)
        self._stop, self._abort = self.state.stopping, self.state.aborting  # the run's two events, the steps' too
        self._stop_reason: str | None = None
        self._cv = threading.Condition()
        self._batches_done = 0  # batches the slots have run (under ``_cv``): against those sent, the slots' load
        self._hooks: RunHooks | None = None
        self._deadline: StopDeadline | None = None  # armed by a stop request

    @property
    def processor(self) -> Processor | None:
        """The processor of this run (None before :meth:`run` opened it)."""
        return self.state.processor

    @property
    def frames(self) -> tuple[_Frame, ...]:
        """Every frame buffer of the run (all sources)."""
        return tuple(f for feed in self.state.feeds for f in feed.frames)

    @property
    def frame_buffer_allocations(self) -> int:
        """Frames the sources could not decode into a frame's own buffer (each frame adopts one, once)."""
        return sum(feed.buffer_allocations for feed in self.state.feeds)

    # -- control ------------------------------------------------------------------------------------
    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop admitting frames; frames in flight finish and sinks flush. Safe from any thread."""
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()
            if self._deadline is not None:
                self._deadline.start()
            for feed in list(self.state.feeds):
                feed.source.stop()
            with self._cv:
                self._cv.notify_all()
            # Observers that care hear it now, before the flush (systemd wants STOPPING=1 at SIGTERM).
            for observer in list(self.observers):
                hook = getattr(observer, "on_stop_requested", None)
                if hook is not None:
                    try:
                        hook(reason)
                    except Exception:  # an observer must never break stopping
                        log.warning("observer %r failed on stop request", observer, exc_info=True)

    def abort(self, reason: str = "aborted") -> None:
        """Stop now, dropping frames in flight; network sinks stop waiting for acknowledgements."""
        self.request_stop(reason)
        self._abort.set()
        for worker in list(self.state.workers):
            abandon = getattr(worker.sink, "abandon", None)
            if abandon is not None:
                abandon()

    def _fail(self, exc: BaseException) -> None:
        self.state.errors.append(exc)
        self.abort("error")

    # -- running ------------------------------------------------------------------------------------
    def run(self) -> JSONDict:
        """Run until every source ends, ``max_frames`` is reached or a stop is requested; return the summary."""
        from edgert.tasks import SPEECH_TASKS

        started = time.perf_counter()
        speech = self.config.task in SPEECH_TASKS  # its stages may take their models from config.speech
        if self.state.processor is None and self._detector is None and not self.config.model.path and not speech:
            raise ConfigError("no model given. Note: pass --model PATH or set model.path in the config")
        if self.config.analytics.enabled and self.config.track is None:
            raise ConfigError("analytics: lines and zones follow tracks: add a track section (track: {tracker: "
                              "bytetrack}) or pass --track")
        self.state.feeds = make_feeds(self.config, self._given_sources)
        from edgert.pipeline.speech import check_sources

        check_sources(self.config, [feed.source for feed in self.state.feeds])
        # Handlers first: a SIGTERM from here on stops the run cleanly (before the sinks open: with every
        # output untouched), and they stay until the last file sink is closed, so a second signal during the
        # close still finalises the files.
        from edgert.pipeline.limits import StopDeadline, stop_deadline_s
        from edgert.pipeline.signals import install_signals

        self._deadline = StopDeadline(stop_deadline_s(), self._stop_overdue)
        restore = install_signals(self.state, self.handle_signals)
        try:
            return self._run(started)
        finally:
            self._deadline.cancel()
            restore()

    def _stop_overdue(self) -> None:
        """A graceful stop past its deadline: drop what is in flight and queued (counted), close the files."""
        from edgert.pipeline.limits import drop_for_deadline

        seconds = self._deadline.seconds if self._deadline is not None else 0.0
        dropped = drop_for_deadline(self.state.feeds, self.state.workers, seconds)
        self.stats.set_drops("stop_deadline", dropped)
        self.abort(self._stop_reason or "stop deadline")

    def _run(self, started: float) -> JSONDict:
        from edgert.pipeline.frames import allocate_frames, release_frames
        from edgert.pipeline.hooks import RunHooks
        from edgert.pipeline.sinks import open_sinks
        from edgert.pipeline.startup import ask_sources_to_stop, close_order, enter_sources, make_stages, start_tracking
        from edgert.tasks import SPEECH_TASKS

        # What can fail to start (a budget without a meter, a metrics port in use) fails before anything opens.
        self._hooks = RunHooks(self.config, self.config.model.path, environment=self.environment)
        try:
            # speech sheds Whisper work by the budget instead of pacing
            if self.admit is None and self.config.task not in SPEECH_TASKS:
                self.admit = self._hooks.admit
            self.observers = [*self._hooks.observers, *self.observers]
            self.state.observers = self.observers  # the results thread: on_frames once per batch
            self.config, processor, self._owns_processor = open_run_processor(self.state, self.config,
                                                                              self._detector, self._owns_processor)
            try:
                # the speech processor takes the budget and the watchdog's progress here
                processor.attach_run(self._hooks, self._progress, [feed.source for feed in self.state.feeds],
                                     self.stats)
                self.state.names = tuple(processor.names)
                processor.warm_up(self.config.runtime.warmup)
                with contextlib.ExitStack() as stack:
                    for feed in self.state.feeds:  # capture workers start together: their imports and opens overlap
                        start = getattr(feed.source, "start", None)
                        if start is not None:
                            stack.callback(feed.source.close)
                            start()
                    enter_sources(self.state.feeds, stack, self._stop.is_set)
                    stack.callback(ask_sources_to_stop, self.state.feeds)  # runs before the closes above
                    make_stages(self.state)  # bad lines and zones are refused before any sink truncates its file
                    self.state.tracking = start_tracking(self.state)  # track.workers: off this interpreter
                    if self.state.tracking is not None:
                        stack.callback(self.state.tracking.close)
                    # the frames too, before any output is truncated
                    allocate_frames(self.state.feeds, processor, self.config.runtime.queue_size)
                    open_sinks(self.state)
                    try:
                        self.state.info = start_info(self.config, self.state, processor, self.stats,
                                                     len(self.frames), self._hooks)
                        self.state.started = False  # on_start: after this run's first frame
                        if not self._stop.is_set():  # a signal during start-up: outputs were left alone
                            self._run_threads(processor)
                    finally:
                        for worker in close_order(self.state.workers):  # network sinks first, files last
                            worker.close()
                    summary = self.summary(time.perf_counter() - started)  # sinks flushed, processor open
            finally:
                release_frames(self.state.feeds)
                if self._owns_processor:
                    processor.close()
        finally:
            power = self._hooks.power_summary() if self._hooks is not None else None
            telemetry = self._hooks.telemetry_summary() if self._hooks is not None else None
            self._hooks.close()
        if telemetry is not None:
            summary["telemetry"] = telemetry
        if power is not None:
            summary["power"] = power
            summary["watts"] = power.get("avg_w")
            summary["mj_per_frame"] = power.get("mj_per_frame")
        self._notify("on_stop", summary)
        if self.state.errors:
            raise self.state.errors[0]
        return summary

    def _run_threads(self, processor: Processor) -> None:
        lanes = len(processor.slots)
        n = len(self.frames)
        # Queues are bounded by the frame count plus their end markers: a put never blocks.
        q_work: queue.Queue[_Batch | None] = queue.Queue(maxsize=n + lanes)
        q_done: queue.Queue[_Batch | None] = queue.Queue(maxsize=n + lanes)
        from edgert.pipeline.collector import Collector, collects
        collected = [feed for feed in self.state.feeds if collects(feed, self.admit is not None)]
        collector = Collector(self.state, collected, self._cv, self.config.runtime.max_frames) if collected else None
        stages: list[tuple[str, Callable[..., None], tuple[object, ...]]] = [  # collected: one thread for all
            (f"capture{feed.index}", self._capture, (feed,)) for feed in self.state.feeds
            if feed.opened and feed not in collected] + ([("capture", collector.run, ())] if collector else [])
        stages.append(("batcher", self._batcher, (processor.batch, q_work, lanes)))
        stages += [(f"slot{k}", self._slot, (processor, slot, q_work, q_done))
                   for k, slot in enumerate(processor.slots)]
        stages.append(("results", self._results, (q_done, lanes)))
        threads = [
            threading.Thread(target=self._guard, args=(fn, args), name=f"edgert-{name}", daemon=True)
            for name, fn, args in stages
        ]
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
            if collector is not None:  # after every thread has stopped
                collector.close()
            if self.state.tracking is not None:  # its sources' final tracks and counts, for the summary
                self.state.tracking.close()
            if self._hooks is not None:
                self._hooks.end()

    def _guard(self, fn: Callable[..., None], args: tuple[object, ...]) -> None:
        try:
            fn(*args)
        except Aborted:  # the abort itself, raised inside a processor's long call: no error of its own
            pass
        except BaseException as exc:  # any stage's failure stops the whole pipeline and is re-raised by run()
            self._fail(exc)

    def _get(self, q: queue.Queue[_T]) -> _T | None:
        """Next item of ``q``; None when the pipeline aborts (even with items still queued: a second signal
        must not wait for a long queue to drain)."""
        while True:
            if self._abort.is_set():
                return None
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                if self._abort.is_set():
                    return None

    # -- stages -------------------------------------------------------------------------------------
    def _capture(self, feed: _Feed) -> None:
        from edgert.errors import EdgertError

        limit = self.config.runtime.max_frames
        source = feed.source
        index = 0
        try:
            while not self._stop.is_set():
                if limit is not None and index >= limit:
                    feed.end_reason = "max_frames"
                    break
                if self.admit is not None:
                    self.admit()
                    if self._stop.is_set():
                        break
                f = self._get(feed.free)
                if f is None:
                    break
                t0 = time.perf_counter()
                try:
                    pixels = source.read(f.pixels)
                except EdgertError as exc:
                    if len(self.state.feeds) == 1:
                        raise  # the run's only source: its failure is the run's
                    feed.free.put(f)
                    feed.error = str(exc)
                    feed.end_reason = "error"
                    log.error("source %s dropped out: %s; the other sources go on", feed.name, exc)
                    break
                if pixels is None:
                    feed.free.put(f)
                    reason = getattr(source, "end_reason", None)
                    if reason:
                        feed.end_reason = str(reason)
                    break
                if pixels is not f.pixels:
                    f.pixels = pixels  # the frame keeps this buffer for its next images
                    feed.buffer_allocations += not getattr(source, "lends_buffers", False)
                f.captured(source, index, max(t0, getattr(source, "ready_at", None) or t0))  # paced: from when due
                if index == 0:
                    from edgert.pipeline.startup import late_stages

                    if not late_stages(self.state, feed):
                        feed.free.put(f)
                        break
                    self.stats.mark_started()
                index += 1
                with self._cv:
                    feed.pending.append(f)
                    self._cv.notify_all()
        finally:
            if self._stop.is_set() and feed.end_reason == "end of input":
                feed.end_reason = "stopped"
            with self._cv:
                feed.ended = True
                self._cv.notify_all()

    def _take(self, batch: list[_Frame], start: int, size: int) -> int:
        """Move ready frames into ``batch`` (up to ``size``), one per source per pass, beginning at source
        ``start``; return where the next batch begins. Call with ``self._cv`` held."""
        feeds = self.state.feeds
        n = len(feeds)
        room = size - len(batch)
        took = True
        while took and room > 0:
            took = False
            for k in range(n):
                feed = feeds[(start + k) % n]
                if feed.pending and room > 0:
                    batch.append(feed.pending.popleft())
                    room -= 1
                    took = True
                    start_next = (feed.index + 1) % n
            if took:
                start = start_next
        return start

    def _batcher(self, size: int, out: queue.Queue[_Batch | None], lanes: int) -> None:
        feeds = self.state.feeds
        timeout = self.config.runtime.batch_timeout_ms / 1000.0
        pending, ended = operator.attrgetter("pending"), operator.attrgetter("ended")
        start = 0
        seq = 0
        stamp = getattr(self.state.processor, "batch_ready", None)  # a run whose model can change: which runs it
        try:
            while True:
                with self._cv:  # any(map(pending)): no Python call per source (docs/results/README.md: host calls)
                    while not self._abort.is_set() and not any(map(pending, feeds)) and not all(map(ended, feeds)):
                        self._cv.wait(_POLL)
                    if self._abort.is_set() or not any(map(pending, feeds)):
                        return  # aborted, or every source has ended and nothing is left
                    batch: list[_Frame] = []
                    start = self._take(batch, start, size)
                    # Wait for stragglers so batches are full (nvstreammux's batched-push-timeout), never past the
                    # deadline, for sources that ended, or with no batch in flight: an idle engine waiting for 16
                    # cameras' stragglers added the timeout to their latency; files keep batches in flight.
                    deadline = time.monotonic() + timeout
                    while len(batch) < size and not self._abort.is_set():
                        if any(map(pending, feeds)):
                            start = self._take(batch, start, size)
                            continue
                        remaining = deadline - time.monotonic()
                        if remaining <= 0 or all(map(ended, feeds)) or seq == self._batches_done:
                            break
                        self._cv.wait(remaining)
                if stamp is not None:
                    stamp(batch)
                out.put(_Batch(seq, batch))
                seq += 1
        finally:
            for _ in range(lanes):  # one end marker per slot thread
                out.put(None)

    def _slot(self, processor: Processor, slot: ProcessorSlot, inq: queue.Queue[_Batch | None],
              out: queue.Queue[_Batch | None]) -> None:
        try:
            with slot.active():
                processor.prepare(slot)
                while True:
                    b = self._get(inq)
                    if b is None:
                        break
                    frames = b.frames
                    dets = slot.process_frames(frames)  # speech reads each chunk's stream and times too
                    for f, d in zip(frames, dets):
                        f.detections = d
                    out.put(b)
                    with self._cv:  # none left in flight: the batcher launches what it has instead of waiting
                        self._batches_done += 1
                        self._cv.notify_all()
        finally:
            out.put(None)

    def _results(self, inq: queue.Queue[_Batch | None], lanes: int) -> None:
        from edgert.pipeline.finish import finish_tail
        from edgert.pipeline.results import finish_batch

        pending: dict[int, _Batch] = {}  # batches that finished before an earlier one (several slots)
        following = 0
        ended = 0
        while ended < lanes:
            b = self._get(inq)
            if b is None:
                if self._abort.is_set():
                    return
                ended += 1
                continue
            pending[b.seq] = b
            while following in pending:
                b = pending.pop(following)
                following += 1
                finish_batch(self.state, b)  # the batch's statistics at once, each frame in order
        if self.state.processor is not None:  # speech: what Whisper finished after the last chunk
            for index, result in self.state.processor.drain():
                finish_tail(self.state, self.state.feeds[index], result)

    def _progress(self) -> None:
        """Work inside one frame moved on (a decoder step of a long Whisper window): observers with an
        ``on_progress`` hear it (systemd's watchdog is fed from it). Called on the slot's thread; after an abort
        (a second signal) it ends that work at this step instead of letting a 30 s window run on."""
        if self._abort.is_set():
            raise Aborted()
        for observer in list(self.observers):
            hook = getattr(observer, "on_progress", None)
            if hook is not None:
                try:
                    hook(self.stats)
                except Exception:  # an observer must never break the processor's work
                    log.warning("observer %r failed on progress", observer, exc_info=True)

    def _notify(self, method: str, arg: object) -> None:
        for observer in list(self.observers):
            try:
                getattr(observer, method)(arg)
            except Exception as exc:  # an observer must not take the pipeline down
                log.error("observer %s failed in %s and is removed: %s", type(observer).__name__, method, exc)
                self.observers.remove(observer)

    # -- results ------------------------------------------------------------------------------------
    def stopped_by(self) -> str:
        """Why the run ended: the stop request's reason, ``max_frames``, or why its source(s) ended."""
        if self._stop_reason is not None:
            return self._stop_reason
        reasons = {feed.end_reason for feed in self.state.feeds}
        if len(self.state.feeds) == 1:
            return next(iter(reasons), "end of input")
        if reasons == {"max_frames"}:
            return "max_frames"
        return "end of input"

    def summary(self, wall_s: float | None = None) -> JSONDict:
        """What ``edgert run --json`` prints, the same for both processors: frames, FPS, per-stage latency,
        drops by reason, detections per class, why it stopped, per-source figures; the GPU processor adds
        ``gpu_ms`` (built by :func:`edgert.pipeline.summary.run_summary`)."""
        from edgert.pipeline.finish import update_drops

        update_drops(self.state)
        return run_summary(config=self.config, stats=self.stats, info=self.state.info, processor=self.state.processor,
                           feeds=self.state.feeds, workers=self.state.workers, names=self.state.names, wall_s=wall_s,
                           class_counts=self.state.class_counts, frames_in_flight=len(self.frames),
                           stopped_by=self.stopped_by(), errors=self.state.errors, batches=self._batches_done)
