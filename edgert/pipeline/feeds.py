"""What flows through the pipeline and what it keeps per source: :class:`_Frame` (one frame in flight and
the pixel buffer it owns), :class:`_Batch` (frames handed to a slot together) and :class:`_Feed` (one source:
its frame ring, its own sinks, its figures and its summary)."""

from __future__ import annotations

import collections
import queue
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgert.redact import redact
from edgert.stats import STAGES

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from edgert.analytics.stages import ResultStage
    from edgert.config import SourceConfig
    from edgert.io.sinks import SinkWorker
    from edgert.pipeline.parts import JSONDict, PipelineSource
    from edgert.vision.detections import Detections


_CAPTURE = STAGES.index("capture")


@dataclass(eq=False)
class _Frame:
    """One frame in flight and the pixel buffer it owns (it always goes back to its own source's free list)."""

    pixels: np.ndarray | None = None
    detections: Detections | None = None  # what its slot found (an audio chunk's: a SpeechResult)
    index: int = 0  # frame number within its source
    feed: int = 0  # which source
    timestamp: float = 0.0  # wall clock at capture (time.time()), what sinks write
    media_time: float = 0.0  # the frame's time on its source's clock: what analytics run on (sources.media_time)
    started: float = 0.0
    file: str | None = None
    meta: Any = None  # what the source says about this frame beyond its pixels (an audio chunk's stream and times)
    lent: int = -1  # the capture worker's ring slot it holds, until given back (the collector's; -1: none)
    generation: int = 0  # the model it runs on, when the run's model can change (edgert.pipeline.model_update)
    notes: list[dict[str, object]] | None = None  # events of the run about this frame (the first on a new model)
    timings: np.ndarray = field(default_factory=lambda: np.zeros(len(STAGES), np.float64))

    def captured(self, source: PipelineSource, index: int, t0: float) -> None:
        """Stamp the frame ``source`` has just read into it as its ``index``-th (``t0``: when the read began):
        its clocks, what the source says of it, its capture time. One place for the capture threads and the
        collector, so a frame reads the same whichever read it."""
        from edgert.io.capture_clock import capture_clock
        from edgert.io.sources import media_time

        self.started = t0
        self.timestamp = time.time()  # written out: the wall clock, as a reader of the records wants it
        self.media_time = media_time(source, index, capture_clock())  # analytics: never a step of the wall clock
        self.index = index
        self.meta = getattr(source, "meta", None)
        current = getattr(source, "current", None)
        self.file = None if current is None else str(current)
        self.timings[_CAPTURE] = time.perf_counter() - t0

    def image(self) -> np.ndarray:
        """Its pixels, once the capture stage has read into it (every frame handed to a slot)."""
        if self.pixels is None:
            raise RuntimeError(f"frame {self.index} of source {self.feed} has no pixels: it was never captured into")
        return self.pixels


@dataclass(eq=False)
class _Batch:
    seq: int
    frames: list[_Frame]


class _Feed:
    """One source of the pipeline: its frames, its own sinks and its figures."""

    def __init__(self, index: int, name: str, source: PipelineSource, config: SourceConfig | None = None) -> None:
        self.index = index
        self.name = name
        self.source = source
        self.config = config  # its SourceConfig when the pipeline opened it
        self.frames: tuple[_Frame, ...] = ()
        self.free: queue.Queue[_Frame] = queue.Queue()
        self.pending: collections.deque[_Frame] = collections.deque()
        self.ended = False
        self.end_reason = "end of input"
        self.error: str | None = None
        self.start_error: str | None = None  # why a live source did not open at start (then reconnected later)
        self.workers: list[SinkWorker] = []
        self.draw = False
        self.done = 0
        self.done_reading = 0  # frames read so far (the collector's count; a capture thread keeps its own)
        #: where its finished frames go when not to ``free``: the collector's hand-back, one call per batch
        self.give_back: Callable[[Sequence[_Frame]], None] | None = None
        self.detections = 0
        self.first_done: float | None = None
        self.last_done: float | None = None
        self.buffer_allocations = 0
        self.media_span: tuple[float, float] | None = None  # media time of its first and last finished frame
        self.stages: list[ResultStage] = []  # tracking, then lines and zones (edgert.analytics), on its frames
        self.opened = False  # its source opened (edgert.pipeline.startup); a source that did not is reported

    def fps(self) -> float:
        if self.done < 2 or self.first_done is None or self.last_done is None or self.last_done <= self.first_done:
            return 0.0
        return (self.done - 1) / (self.last_done - self.first_done)

    def undecodable(self) -> dict[str, int]:
        """Frames the source could not decode, by reason (a damaged file): not drops, the input lacked them."""
        by_reason = getattr(self.source, "skipped_by_reason", None)
        if by_reason:
            return {str(k): int(v) for k, v in by_reason.items() if v}
        skipped = int(getattr(self.source, "skipped", 0) or 0)
        return {"corrupt_frames": skipped} if skipped else {}

    def drops(self) -> dict[str, int]:
        """Frames that were there and not processed: stale live frames, frames a slow sink skipped."""
        out: dict[str, int] = {}
        if self.source.live and self.source.dropped:
            out["stale_frames"] = int(self.source.dropped)
        for worker in self.workers:
            if worker.dropped and not worker.sink.skips_frames:
                out[f"sink:{redact(worker.sink.uri)}"] = int(worker.dropped)
        return out

    def summary(self) -> JSONDict:
        out: JSONDict = {
            "name": self.name, "uri": self.source.uri, "frames": self.done, "fps": round(self.fps(), 2),
            "detections": self.detections, "drops": self.drops(), "undecodable": self.undecodable(),
            "time_base": time_base(self.source),
            # seconds of the source's own time the run covered: the base for rates (crossings per minute)
            "media_s": round(self.media_span[1] - self.media_span[0], 3) if self.media_span else 0.0,
            "reconnects": int(getattr(self.source, "reconnects", 0)), "ended": self.end_reason,
            "sinks": [redact(w.sink.uri) for w in self.workers], "capture": getattr(self.source, "capture", "thread"),
        }
        if self.error is not None:
            out["error"] = redact(self.error)
        if self.start_error is not None:
            out["start_error"] = redact(self.start_error)
        if getattr(self.source, "reconnecting", False):
            out["reconnecting"] = True  # down when the run ended, its grabber still reconnecting
        if self.stages:
            from edgert.analytics.stages import stages_summary

            out.update(stages_summary(self.stages))
        return out


def time_base(source: PipelineSource) -> str:
    from edgert.io.sources import time_base as source_time_base

    return source_time_base(source)


def expected_frames(feeds: list[_Feed], max_frames: int | None) -> int | None:
    """Frames a run will process (``max_frames`` applies per source) when every source knows its count
    (files, folders); None when one cannot say (a camera, a stream, a looped file) and no limit is set."""
    total = 0
    for feed in feeds:
        count = getattr(feed.source, "expected_frames", lambda: None)()
        if count is None and not max_frames:
            return None
        total += min(count, max_frames) if count is not None and max_frames else (count or max_frames or 0)
    return total
