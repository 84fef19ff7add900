"""The speech chain: VAD -> wake word -> Whisper, each stage gating the next.

* ``vad`` turns chunks into speech segments (each keeps its audio).
* ``wakeword`` listens only while the VAD hears speech (with a second of pre-roll, so the start of
  the word is not lost to the VAD's trigger delay).
* ``asr`` transcribes VAD segments: all of them, or with a wake-word stage only those that contain a
  wake word or start within ``listen_s`` after one. Without a VAD stage it transcribes whole streams
  in 30 s windows.

Per-stage busy time gives the real-time factor (processing seconds per second of audio) and the share
of the audio Whisper actually ran on, the figures that say whether a board keeps up. For live sources
Whisper runs on a worker thread with a bounded queue, so the microphone is read while it works.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from edgert.errors import Aborted, ConfigError
from edgert.speech.asr import Transcriber
from edgert.speech.audio import SAMPLE_RATE, AudioChunk
from edgert.speech.features import N_SAMPLES
from edgert.speech.results import SpeechSegment, Transcript, WakeEvent
from edgert.speech.vad import VoiceActivity
from edgert.speech.wakeword import WakeWord

__all__ = ["SpeechChain", "StageStats", "iter_events"]

log = logging.getLogger(__name__)

PREROLL_S = 1.0  # the embedding window is 0.76 s; 1 s also covers the VAD trigger delay
Event = Union[SpeechSegment, WakeEvent, Transcript]


@dataclass
class StageStats:
    """Busy time of one stage, and the audio it was given."""

    calls: int = 0
    seconds: float = 0.0
    audio_seconds: float = 0.0

    def to_dict(self, total_audio: float) -> dict[str, Any]:
        return {"calls": self.calls, "seconds": round(self.seconds, 4), "audio_seconds": round(self.audio_seconds, 3),
                "rtf": round(self.seconds / total_audio, 4) if total_audio else None}


class SpeechChain:
    """Run ``vad``, ``wakeword`` and ``asr`` (any may be None) over audio chunks, emitting events."""

    def __init__(
        self,
        vad: VoiceActivity | None = None,
        wakeword: WakeWord | None = None,
        asr: Transcriber | None = None,
        listen_s: float = 8.0,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        if vad is None and wakeword is None and asr is None:
            raise ConfigError("speech chain: no stage to run (vad, wakeword, asr)")
        if wakeword is not None and asr is not None and vad is None:
            raise ConfigError("speech chain: a wake word gates Whisper through VAD segments: add a VAD stage")
        self.vad = vad
        self.wakeword = wakeword
        self.asr = asr
        self.listen_s = listen_s
        self.on_event = on_event
        self.stats = {name: StageStats() for name, stage in (("vad", vad), ("wakeword", wakeword), ("asr", asr))
                      if stage is not None}
        self.audio_seconds = 0.0
        self.chunks = 0
        self.counts = {"segment": 0, "wake": 0, "transcript": 0, "skipped_segments": 0, "dropped_segments": 0,
                       "no_speech_segments": 0, "shed_segments": 0}
        #: Called before each Whisper window; False skips it (the power budget sheds windows, counted).
        self.before_asr: Callable[[SpeechSegment], bool] | None = None
        self.cut_queued = 0
        self._stream = ""
        self._preroll: deque[AudioChunk] = deque()
        self._was_speech = False
        self._last_wake: float | None = None
        self._whole: list[np.ndarray] = []  # without VAD: the stream's audio waiting for Whisper
        self._whole_start = 0.0
        self._worker: _AsrWorker | None = None
        self._lock = threading.Lock()
        self._prompt: tuple[int, ...] = ()  # the previous whole-stream window's text, for the next window
        self._prompt_stream = ""

    # -- events ------------------------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        kind = event.to_dict()["type"]
        with self._lock:
            self.counts[kind] += 1
            if self.on_event is not None:
                self.on_event(event)

    def _timed(self, name: str, fn: Callable[[], Any], audio_seconds: float) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            st = self.stats[name]
            st.calls += 1
            st.seconds += time.perf_counter() - t0
            st.audio_seconds += audio_seconds

    # -- the per-chunk work ------------------------------------------------------------------------
    def process(self, chunk: AudioChunk) -> None:
        """Feed one chunk through the chain; events go to ``on_event`` as they happen."""
        if chunk.stream != self._stream or chunk.index == 0:
            self._new_stream(chunk.stream)
        self.chunks += 1
        self.audio_seconds += chunk.duration
        segments: list[SpeechSegment] = []
        if self.vad is not None:
            vad = self.vad
            segments = self._timed("vad", lambda: vad.process(chunk), chunk.duration)
        if self.wakeword is not None:
            self._wakeword(chunk)
        for seg in segments:
            self._emit(seg)
            self._maybe_transcribe(seg)
        if self.asr is not None and self.vad is None:
            self._whole_stream(chunk)

    def _new_stream(self, stream: str) -> None:
        self._stream = stream
        self._preroll.clear()
        self._was_speech = False
        self._last_wake = None
        self._whole = []
        self._whole_start = 0.0
        if self.wakeword is not None:  # it sees only speech chunks, so it may not see this stream's first
            self.wakeword.reset(stream)

    def _wakeword(self, chunk: AudioChunk) -> None:
        ww = self.wakeword
        if ww is None:
            return
        in_speech = self.vad is None or self.vad.in_speech
        feed: list[AudioChunk] = []
        if in_speech:
            if not self._was_speech:
                feed.extend(self._preroll)
                self._preroll.clear()
            feed.append(chunk)
        else:
            self._preroll.append(chunk)
            while sum(c.duration for c in self._preroll) > PREROLL_S:
                self._preroll.popleft()
        self._was_speech = in_speech
        for c in feed:
            events: list[WakeEvent] = self._timed("wakeword", lambda c=c: ww.process(c), c.duration)  # type: ignore[misc]
            for ev in events:
                self._last_wake = ev.time
                self._emit(ev)

    def _maybe_transcribe(self, seg: SpeechSegment) -> None:
        if self.asr is None:
            return
        if self.wakeword is not None:
            last = self._last_wake
            if last is None or not (seg.start - 0.5 <= last <= seg.end + 0.5 or 0 <= seg.start - last <= self.listen_s):
                self.counts["skipped_segments"] += 1
                return
        if self._worker is not None:
            self._worker.submit(seg)
        else:
            self._transcribe(seg)

    def _transcribe(self, seg: SpeechSegment) -> None:
        asr = self.asr
        if asr is None:
            return
        if self.before_asr is not None and not self.before_asr(seg):
            with self._lock:
                self.counts["shed_segments"] += 1
            return
        ungated = self.vad is None  # without a VAD, Whisper's no-speech estimate is the only silence guard
        # Without a VAD the stream goes to Whisper in consecutive 30 s windows: each is conditioned on the text of
        # the one before (condition_on_previous_text, as the reference's transcribe over long audio).
        prompt = self._prompt if ungated and seg.stream == self._prompt_stream else ()
        transcript: Transcript = self._timed(
            "asr", lambda: asr.transcribe_segment(seg, ungated=ungated, prompt=prompt), seg.duration)
        if ungated:
            self._prompt, self._prompt_stream = asr.next_prompt, seg.stream
        if transcript.no_speech:  # Whisper's silence rule: noise the VAD let through, or silence without one
            with self._lock:
                self.counts["no_speech_segments"] += 1
            return
        self._emit(transcript)

    def _whole_stream(self, chunk: AudioChunk) -> None:
        if not self._whole:
            self._whole_start = chunk.start
        self._whole.append(chunk.samples)
        held = sum(len(a) for a in self._whole)
        if held >= N_SAMPLES or chunk.last:
            self._flush_whole()

    def _flush_whole(self) -> None:
        if not self._whole:
            return
        audio = np.concatenate(self._whole).astype(np.float32, copy=False)
        self._whole = []
        start = self._whole_start
        seg = SpeechSegment(start=start, end=start + len(audio) / SAMPLE_RATE, probability=1.0, stream=self._stream,
                            audio=audio)
        self._whole_start = seg.end
        if self._worker is not None:
            self._worker.submit(seg)
        else:
            self._transcribe(seg)

    def flush(self) -> None:
        """End of input: close an open segment and transcribe what is waiting."""
        if self.vad is not None:
            vad = self.vad
            for seg in self._timed("vad", vad.flush, 0.0):
                self._emit(seg)
                self._maybe_transcribe(seg)
        elif self.asr is not None:
            self._flush_whole()

    # -- live sources: Whisper on its own thread -------------------------------------------------------
    def start_worker(self, depth: int = 4) -> None:
        """Run Whisper on a worker thread with a queue of ``depth`` segments (a live source: the microphone
        is read while Whisper works; when Whisper falls behind, the oldest waiting segment is dropped)."""
        if self.asr is not None and self._worker is None:
            self._worker = _AsrWorker(self, depth)

    def stop_worker(self) -> None:
        """Stop the worker; the segments still waiting are counted as cut (``cut.queued_segments``)."""
        if self._worker is not None:
            worker, self._worker = self._worker, None
            self.cut_queued += worker.discard()
            worker.close()

    @property
    def queue_depth(self) -> int:
        """Segments waiting for Whisper's worker (0 without one)."""
        return self._worker.depth if self._worker is not None else 0

    def cut(self) -> dict[str, Any]:
        """What a stop left unprocessed: the speech of an open VAD segment, the audio waiting for a whole-stream
        Whisper window, the segments waiting for the worker."""
        open_s = 0.0
        if self.vad is not None:
            open_s = float(self.vad.open_seconds())
        held = sum(len(a) for a in self._whole) / SAMPLE_RATE
        return {"open_segment_s": round(open_s, 3), "untranscribed_s": round(held, 3),
                "queued_segments": self.cut_queued}

    def summary(self, wall: float = 0.0) -> dict[str, Any]:
        """The speech figures of a run: real-time factor per stage, Whisper's share of the audio, events by kind."""
        audio = self.audio_seconds
        busy = sum(s.seconds for s in self.stats.values())
        asr = self.stats.get("asr")
        out: dict[str, Any] = {
            "chain": list(self.stats),
            "chunks": self.chunks,
            "audio_seconds": round(audio, 3),
            "busy_seconds": round(busy, 3),
            "wall_seconds": round(wall, 3),
            "rtf": round(busy / audio, 4) if audio else None,
            "wall_rtf": round(wall / audio, 4) if audio and wall else None,
            "whisper_audio_seconds": round(asr.audio_seconds, 3) if asr else 0.0,
            "whisper_share": round(asr.audio_seconds / audio, 4) if asr and audio else 0.0,
            "segments": self.counts["segment"],
            "wake_events": self.counts["wake"],
            "transcripts": self.counts["transcript"],
            "skipped_segments": self.counts["skipped_segments"],
            "dropped_segments": self.counts["dropped_segments"],
            "no_speech_segments": self.counts["no_speech_segments"],
            "shed_segments": self.counts["shed_segments"],
            "stages": {name: st.to_dict(audio) for name, st in self.stats.items()},
        }
        if self.vad is not None:
            out["stages"]["vad"]["windows"] = self.vad.windows
        if self.wakeword is not None:
            out["stages"]["wakeword"]["steps"] = self.wakeword.steps
        return out

    def close(self) -> None:
        for stage in (self.vad, self.wakeword, self.asr):
            if stage is not None:
                stage.close()

    def __enter__(self) -> SpeechChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsrWorker:
    """Whisper on its own thread for live sources; when it falls behind, the oldest segment is dropped."""

    def __init__(self, chain: SpeechChain, depth: int = 4) -> None:
        self._chain = chain
        self._queue: queue.Queue[SpeechSegment | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="edgert-whisper", daemon=True)
        self._thread.start()

    def submit(self, seg: SpeechSegment) -> None:
        if self.error is not None:
            raise self.error
        while True:
            try:
                self._queue.put_nowait(seg)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()
                    self._chain.counts["dropped_segments"] += 1
                except queue.Empty:
                    pass

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def discard(self) -> int:
        """Empty the queue; how many segments were waiting."""
        n = 0
        while True:
            try:
                if self._queue.get_nowait() is not None:
                    n += 1
            except queue.Empty:
                return n

    def _loop(self) -> None:
        while True:
            seg = self._queue.get()
            if seg is None:
                return
            try:
                self._chain._transcribe(seg)
            except Aborted:  # the run was aborted inside this window: stop, no error
                return
            except BaseException as exc:  # handed to the reading thread on its next submit, or at close
                self.error = exc
                return

    def close(self) -> None:
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join()
        if self.error is not None:
            raise self.error


def iter_events(chain: SpeechChain, chunks: Iterable[AudioChunk]) -> list[Event]:
    """Every event of ``chunks`` (a helper for tests and notebooks)."""
    events: list[Event] = []
    previous = chain.on_event
    chain.on_event = events.append
    try:
        for c in chunks:
            chain.process(c)
        chain.flush()
    finally:
        chain.on_event = previous
    return events
