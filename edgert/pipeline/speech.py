"""The speech processor: the speech chain (VAD -> wake word -> Whisper) as a processor of the one pipeline.

An audio source's "frame" is one chunk of samples (:mod:`edgert.io.audio_sources`); the one slot feeds it
through the chain of its source (one chain per source: VAD and wake-word state are per stream) and hands the
events the chunk completed (segments, wake words, transcripts) to the results stage as the chunk's events, so
they reach every sink of the one registry (JSONL, MQTT with ``?events=only``, a callback) in order. The chunk
itself is no record (``frame_record`` False): sinks write its events only.

Threads, as before the move: the pipeline's capture thread reads the source (a microphone has its own bounded
queue), the slot thread runs VAD and the wake word, and for a live source Whisper runs on its own worker with
a bounded queue of segments (the oldest is dropped and counted when it falls behind); a file's Whisper runs on
the slot thread, so a file is never cut short. Around the chain, the pipeline gives a speech run what it gives
detection: the power budget (here it sheds Whisper work instead of pacing chunks: :class:`WhisperBudget`),
metrics (``PipelineStats.speech``), systemd's watchdog fed by every decoder step of a long window, signals,
drop accounting and the one summary, with the speech figures under ``speech``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import ConfigError
from edgert.io.audio_sources import is_audio_source
from edgert.pipeline.processor import Processor, ProcessorSlot
from edgert.stats import STAGES
from edgert.tasks import SPEECH_TASKS
from edgert.vision.detections import Detections

if TYPE_CHECKING:
    from edgert.pipeline.feeds import _Frame
    from edgert.pipeline.hooks import RunHooks
    from edgert.pipeline.parts import JSONDict, PipelineSource
    from edgert.power.budget import BudgetController
    from edgert.speech.asr import Transcriber
    from edgert.speech.audio import AudioChunk
    from edgert.speech.chain import Event, SpeechChain
    from edgert.speech.results import SpeechSegment
    from edgert.stats import PipelineStats

from edgert.pipeline.speech_result import SpeechResult

__all__ = ["SpeechProcessor", "SpeechResult", "WhisperBudget", "check_sources", "refuse_vision_keys"]

log = logging.getLogger(__name__)

_INFER = STAGES.index("infer")
_STATS_EVERY = 10  # chunks between refreshes of the metrics' speech figures


def _take(pending: deque[JSONDict]) -> list[JSONDict]:
    """The events collected so far, oldest first; one appended meanwhile waits for the next take."""
    events = []
    for _ in range(len(pending)):
        events.append(pending.popleft())
    return events


def check_sources(config: PipelineConfig, sources: Sequence[PipelineSource]) -> None:
    """A speech task reads audio sources only, and detection never does: one line naming the source."""
    speech = config.task in SPEECH_TASKS
    for source in sources:
        if speech and not is_audio_source(source):
            raise ConfigError(f"{source.uri}: task {config.task} reads audio (a .wav/.flac/.ogg file, a folder of "
                              "clips, alsa://DEVICE, mic://N), not this source")
        if not speech and is_audio_source(source):
            raise ConfigError(f"{source.uri}: an audio source; task {config.task} reads video and images. Note: "
                              "pass --task vad, wakeword or asr")


def refuse_vision_keys(config: PipelineConfig) -> None:
    """The config keys a speech task cannot use, refused in one line naming each (the flags' twin:
    :mod:`edgert.cli.run_flags`)."""
    rt = config.runtime
    wrong = [key for key, on in (
        ("track", config.track is not None), ("analytics", config.analytics.enabled),
        ("runtime.slots", rt.slots is not None), ("runtime.batch", rt.batch is not None),
        ("runtime.memory", rt.memory is not None), ("runtime.cuda_graph", rt.cuda_graph is not None),
        ("runtime.part_batches", rt.part_batches is not None),
        ("runtime.processing", rt.processing != "auto"),
        ("source.loop", any(s.loop for s in config.all_sources())),
        ("source.preload", any(s.preload for s in config.all_sources())),
        ("source.realtime", any(s.realtime for s in config.all_sources()))) if on]
    if wrong:
        raise ConfigError(f"{', '.join(wrong)}: detection only; task {config.task} runs the speech chain")


class WhisperBudget:
    """Whisper does less while the power budget is exceeded: beam search narrows to greedy first, and when that
    is still over, windows are skipped. Asked before each Whisper window (``SpeechChain.before_asr``)."""

    def __init__(self, controller: BudgetController, asr: Transcriber) -> None:
        self.controller = controller
        self.asr = asr
        self.decoding = asr.decoding  # as configured; restored when the budget allows it again
        self.level = 0  # 0: as configured, 1: greedy, 2: skipping windows
        self.narrowed = 0
        self.shed = 0
        self.shed_audio_s = 0.0
        self.checks = 0
        self.over = 0

    def __call__(self, segment: SpeechSegment) -> bool:
        self.checks += 1
        top = 2
        if self.controller.over_budget:
            self.over += 1
            self.level = min(self.level + 1, top)
            if self.level == 1 and self.decoding != "beam":
                self.level = 2  # greedy already: the only cheaper window is none
        else:
            self.level = max(self.level - 1, 0)
        if self.level >= 2:
            self.shed += 1
            self.shed_audio_s += float(segment.duration)
            return False
        self.asr.decoding = "greedy" if self.level == 1 else self.decoding
        self.narrowed += self.level == 1
        return True

    def summary(self) -> JSONDict:
        return {"windows_checked": self.checks, "over_budget_checks": self.over, "windows_narrowed": self.narrowed,
                "windows_shed": self.shed, "audio_shed_s": round(self.shed_audio_s, 3),
                "decoding": self.decoding}


class _SpeechSlot(ProcessorSlot):
    def __init__(self, processor: SpeechProcessor) -> None:
        self.processor = processor

    def process(self, frames: Sequence[np.ndarray], timings: Sequence[np.ndarray]) -> list[Detections]:
        raise ConfigError("the speech processor takes the pipeline's frames with their chunks (process_frames)")

    def process_frames(self, frames: Sequence[_Frame]) -> list[SpeechResult]:
        return [self.processor.process_chunk(f.feed, f.meta, f.timings) for f in frames]


class SpeechProcessor(Processor):
    """The stages of ``config``'s speech chain, one chain per source, behind one pipeline slot."""

    kind = "speech"

    def __init__(self, config: PipelineConfig, sources: int = 1) -> None:
        super().__init__()
        from edgert.speech.stages import build_chain, resolve_chain

        refuse_vision_keys(config)
        self.config = config
        self.chain_names, self.models = resolve_chain(config)
        self.chains: list[SpeechChain] = []
        try:
            for _ in range(max(1, sources)):  # one Whisper for all: the later chains fork the first one's
                self.chains.append(build_chain(config, like=self.chains[0] if self.chains else None))
        except BaseException:
            self.close()
            raise
        # Events arrive from the slot thread and from each source's Whisper worker; a deque's append and popleft
        # are atomic, so the slot takes them without reaching into the chain's lock.
        self._pending: list[deque[JSONDict]] = [deque() for _ in self.chains]
        for i, chain in enumerate(self.chains):
            chain.on_event = self._collector(i)
        first = self.chains[0]
        stage = first.vad or first.wakeword or first.asr
        session = getattr(stage, "session", None) or getattr(getattr(stage, "encoder", None), "session", None)
        self.backend_name = str(getattr(session, "backend_name", None) or config.model.backend)
        self.input_name = "audio"
        self.input_shape = (config.speech.chunk_samples,)
        self.slots = [_SpeechSlot(self)]
        self.budgets: list[WhisperBudget] = []
        self._stats: PipelineStats | None = None
        self._started: float | None = None
        self._chunks = 0

    def _collector(self, index: int) -> Callable[[Event], None]:
        pending = self._pending[index]

        def collect(event: Event) -> None:  # the slot thread or the source's Whisper worker
            pending.append(event.to_dict())

        return collect

    # -- the pipeline's side ----------------------------------------------------------------------
    def attach_run(self, hooks: RunHooks | None, progress: Callable[[], None], sources: Sequence[PipelineSource],
                   stats: PipelineStats) -> None:
        """Wire the run: chunk size and Whisper's worker per source, the budget, the watchdog's progress."""
        self._stats = stats
        for i, source in enumerate(sources):
            if hasattr(source, "set_chunk"):
                source.set_chunk(self.config.speech.chunk_samples)
            if getattr(source, "live", False) and i < len(self.chains):
                self.chains[i].start_worker()
        controller = getattr(hooks, "controller", None) if hooks is not None else None
        for chain in self.chains:
            if chain.asr is None:
                continue
            chain.asr.on_step = progress
            if controller is not None:
                budget = WhisperBudget(controller, chain.asr)
                chain.before_asr = budget
                self.budgets.append(budget)
        if controller is not None:
            controller.start()  # readings from the first chunk; no admission pacing for audio

    def warm_up(self, runs: int) -> None:
        """Nothing: the stages' first calls are milliseconds, and Whisper's first window is a real one."""

    def process_chunk(self, feed: int, chunk: AudioChunk, timings: np.ndarray) -> SpeechResult:
        chain = self.chains[feed]
        if self._started is None:
            self._started = time.perf_counter()
        t0 = time.perf_counter()
        chain.process(chunk)
        if chunk.last:
            chain.flush()
        timings[_INFER] = time.perf_counter() - t0
        events = _take(self._pending[feed])
        self._chunks += 1
        if self._stats is not None and self._chunks % _STATS_EVERY == 1:
            self._stats.speech = self.live_figures()
        return SpeechResult(events)

    def drain(self) -> list[tuple[int, SpeechResult]]:
        """The last frame is through (a stop, or the end of input): Whisper's workers finish the window they are
        in, the segments still waiting are cut (counted), and the events that came since the last chunk are
        handed back per source for the sinks."""
        out: list[tuple[int, SpeechResult]] = []
        for i, chain in enumerate(self.chains):
            chain.stop_worker()
            events = _take(self._pending[i])
            if events:
                out.append((i, SpeechResult(events)))
        return out

    def live_figures(self) -> JSONDict:
        """What the metrics endpoint serves: RTF per stage, Whisper's queue, events per kind (all sources)."""
        audio = sum(c.audio_seconds for c in self.chains)
        rtf: dict[str, float] = {}
        for chain in self.chains:
            for name, st in chain.stats.items():
                rtf[name] = rtf.get(name, 0.0) + st.seconds
        events: dict[str, int] = {}
        for chain in self.chains:
            for kind in ("segment", "wake", "transcript"):
                events[kind] = events.get(kind, 0) + int(chain.counts[kind])
        return {"audio_seconds": audio, "busy_seconds": sum(rtf.values()),
                "rtf": {k: (v / audio if audio else 0.0) for k, v in rtf.items()},
                "queue_depth": sum(c.queue_depth for c in self.chains), "events": events,
                "shed_windows": sum(b.shed for b in self.budgets)}

    def speech_summary(self) -> JSONDict:
        """The summary's ``speech`` section. The run is over when the pipeline asks: Whisper's workers stop here
        and what they still held is counted under ``cut``."""
        for chain in self.chains:
            chain.stop_worker()
        wall = time.perf_counter() - self._started if self._started is not None else 0.0
        if self._stats is not None:
            self._stats.speech = self.live_figures()
        per = [chain.summary(wall) for chain in self.chains]
        out: JSONDict = dict(per[0])
        if len(per) > 1:  # several sources: totals, and each source's own figures
            for key in ("chunks", "segments", "wake_events", "transcripts", "skipped_segments", "dropped_segments",
                        "no_speech_segments", "shed_segments"):
                out[key] = sum(p[key] for p in per)
            out["audio_seconds"] = round(sum(p["audio_seconds"] for p in per), 3)
            out["per_source"] = per
        cut = [chain.cut() for chain in self.chains]
        out["cut"] = {k: round(sum(c[k] for c in cut), 3) for k in cut[0]}
        out["models"] = {stage: list(m) if isinstance(m, tuple) else m for stage, m in self.models.items()}
        if self.budgets:
            out["budget"] = {k: (sum(b.summary()[k] for b in self.budgets) if k != "decoding"
                                 else self.budgets[0].decoding) for k in self.budgets[0].summary()}
        return out

    def describe(self) -> JSONDict:
        return {"kind": self.kind, "slots": 1, "batch": 1, "chain": list(self.chain_names)}

    def close(self) -> None:
        for chain in self.chains:
            try:
                chain.stop_worker()
            finally:
                chain.close()
        self.chains = []
        super().close()
