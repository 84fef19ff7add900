"""Voice activity with Silero VAD v6: streaming probabilities and hysteresis segments.

The model reads 512 new samples at 16 kHz with the 64 samples before them as context (576 in all)
and carries a recurrent state [2, 1, 128] from call to call; ``sr`` is an int64 scalar. Windows are
turned into segments the way silero-vad's own ``get_speech_timestamps`` does: speech starts when
the probability reaches ``threshold``, ends only after it stays below ``neg_threshold`` (default
``threshold - 0.15``) for ``min_silence_s``; segments shorter than ``min_speech_s`` are dropped;
``pad_s`` of audio is kept on each side; a segment longer than ``max_speech_s`` is cut (Whisper reads
at most 30 s at once).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from edgert.backends import Backend, Session, SessionOptions, get_backend
from edgert.backends.onnxruntime import OnnxRuntimeSession
from edgert.errors import InputError, ModelError
from edgert.speech.audio import SAMPLE_RATE, AudioChunk
from edgert.speech.results import SpeechSegment

__all__ = ["CONTEXT", "WINDOW", "VoiceActivity"]

log = logging.getLogger(__name__)

WINDOW = 512  # new samples per call at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window the model sees again


class _SileroOrtSession(OnnxRuntimeSession):
    """ONNX Runtime session that sets ``sr`` before the shape-probing run at open.

    The ONNX Runtime backend learns dynamic output sizes by one run on zeroed inputs; Silero's
    ``silero_vad.onnx`` branches on ``sr`` (If nodes) and fails for sr=0. The op18 "ifless" export
    does not care, the common one does, so the rate is set first.
    """

    def _allocate_outputs(self) -> None:
        if "sr" in self.inputs:
            self.inputs["sr"][...] = SAMPLE_RATE
        super()._allocate_outputs()


def _open_vad(model: str | Path, backend: str, options: SessionOptions) -> Session:
    chosen = get_backend(backend)
    if chosen.name == "onnxruntime":
        return _SileroOrtSession(Backend._model_path(model), options)
    return chosen.open(model, options)


class VoiceActivity:
    """Streaming Silero VAD. Feed :class:`AudioChunk` s to :meth:`process`; it returns the segments that
    closed. ``flush()`` (or a chunk with ``last=True``) closes the one still open."""

    def __init__(
        self,
        model: str | Path,
        backend: str = "auto",
        threads: int = 0,
        threshold: float = 0.5,
        neg_threshold: float | None = None,
        min_speech_s: float = 0.25,
        min_silence_s: float = 0.5,
        pad_s: float = 0.1,
        max_speech_s: float = 28.0,
        keep_audio: bool = True,
    ) -> None:
        neg = threshold - 0.15 if neg_threshold is None else neg_threshold
        if not 0.0 < threshold < 1.0 or not 0.0 <= neg <= threshold:
            raise InputError(f"VAD thresholds: expected 0 <= neg_threshold <= threshold < 1, got {neg}, {threshold}")
        if min(min_speech_s, min_silence_s, pad_s) < 0 or max_speech_s <= min_speech_s:
            raise InputError("VAD durations: expected non-negative times and max_speech_s > min_speech_s")
        self.threshold = threshold
        self.neg_threshold = max(neg, 0.01)
        self._min_speech = int(min_speech_s * SAMPLE_RATE)
        self._min_silence = int(min_silence_s * SAMPLE_RATE)
        self._pad = int(pad_s * SAMPLE_RATE)
        self._max_speech = int(max_speech_s * SAMPLE_RATE)
        self.keep_audio = keep_audio
        shapes = {"input": (1, CONTEXT + WINDOW), "state": (2, 1, 128)}
        self.session = _open_vad(model, backend, SessionOptions(threads=threads, shapes=shapes))
        names = sorted(s.name for s in self.session.input_specs)
        if names != ["input", "sr", "state"]:
            self.session.close()
            raise ModelError(f"{model}: not a Silero VAD v5/v6 model: inputs are {', '.join(names)}; "
                             "expected input, state, sr")
        self._input = self.session.inputs["input"]
        self._state = self.session.inputs["state"]
        self.session.inputs["sr"][...] = SAMPLE_RATE
        self._state_out = self.session.output_specs[1].name
        self._prob_out = self.session.output_specs[0].name
        self.windows = 0  # windows run since open (a figure for stats)
        self.stream = ""
        self.reset()

    # -- the model ---------------------------------------------------------------------------------
    def reset(self, stream: str = "") -> None:
        """Start a new stream: zero state and context, forget any open segment."""
        self.stream = stream
        self._state.fill(0.0)
        self._input.fill(0.0)
        self._pending = np.zeros(0, dtype=np.float32)
        self._pos = 0  # samples of this stream already run through the model
        self._history: list[np.ndarray] = []  # audio kept for segments, starting at sample _hist_start
        self._hist_start = 0
        self._hist_len = 0
        self._triggered = False
        self._start = 0
        self._temp_end = 0
        self._probs: list[float] = []
        self._prev_end = 0

    def window_probability(self, window: np.ndarray) -> float:
        """Speech probability of the next 512 samples; state and context carry to the next call."""
        if window.shape != (WINDOW,):
            raise InputError(f"VAD window: expected {WINDOW} samples, got {window.shape}")
        self._input[0, :CONTEXT] = self._input[0, WINDOW:]  # the last 64 samples become the context
        self._input[0, CONTEXT:] = window
        out = self.session.infer()
        np.copyto(self._state, out[self._state_out])
        self.windows += 1
        return float(out[self._prob_out].reshape(-1)[0])

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        """Probabilities of every 512-sample window of ``audio`` (a fresh stream; the tail is zero-padded)."""
        self.reset()
        n = -(-len(audio) // WINDOW)
        padded = np.zeros(n * WINDOW, dtype=np.float32)
        padded[: len(audio)] = audio
        return np.array([self.window_probability(padded[i * WINDOW : (i + 1) * WINDOW]) for i in range(n)])

    @property
    def in_speech(self) -> bool:
        """Whether a segment is open (speech started and has not yet ended)."""
        return self._triggered

    def open_seconds(self) -> float:
        """Seconds of speech in the open segment (0 when none is open): what a stop now would cut."""
        return max(self._pos - self._start, 0) / SAMPLE_RATE if self._triggered else 0.0

    # -- segments ----------------------------------------------------------------------------------
    def process(self, chunk: AudioChunk) -> list[SpeechSegment]:
        """Run the windows ``chunk`` completes; return the segments that closed."""
        start = round(chunk.start * SAMPLE_RATE)
        if chunk.stream != self.stream or chunk.index == 0 or start < self._pos:
            self.reset(chunk.stream)
        hole = start - (self._pos + len(self._pending))
        if hole > 0:
            # A live source dropped audio: the clock jumps with it; kept audio gets silence in its place.
            self._keep(np.zeros(len(self._pending) + hole, dtype=np.float32))
            self._pos = start
            self._pending = np.zeros(0, dtype=np.float32)
        samples = np.asarray(chunk.samples, dtype=np.float32)
        self._pending = np.concatenate((self._pending, samples)) if self._pending.size else samples
        closed: list[SpeechSegment] = []
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            closed += self._step(window)
        if chunk.last:
            closed += self.flush()
        return closed

    def flush(self) -> list[SpeechSegment]:
        """End of stream: run the zero-padded remainder and close an open segment."""
        closed: list[SpeechSegment] = []
        end_of_audio = self._pos + len(self._pending)
        if len(self._pending):
            window = np.zeros(WINDOW, dtype=np.float32)
            window[: len(self._pending)] = self._pending
            self._pending = np.zeros(0, dtype=np.float32)
            closed += self._step(window, valid=end_of_audio - self._pos)
        if self._triggered:
            end = self._temp_end if self._temp_end else end_of_audio
            closed += self._close(end, end_of_audio)
        return closed

    def _step(self, window: np.ndarray, valid: int = WINDOW) -> list[SpeechSegment]:
        prob = self.window_probability(window)
        here = self._pos
        self._keep(window[:valid])
        self._pos += valid
        closed: list[SpeechSegment] = []
        if prob >= self.threshold:
            self._temp_end = 0
            if not self._triggered:
                self._triggered = True
                self._start = here
                self._probs = []
        if self._triggered:
            self._probs.append(prob)
            if prob < self.neg_threshold:
                if not self._temp_end:
                    self._temp_end = here
                if self._pos - self._temp_end >= self._min_silence:
                    closed += self._close(self._temp_end, self._pos)
            elif self._pos + WINDOW - self._start > self._max_speech:  # the next window would be too long
                closed += self._close(self._pos, self._pos)
        if not self._triggered:
            self._trim_history()
        return closed

    def _close(self, end: int, available: int) -> list[SpeechSegment]:
        start = self._start
        self._triggered = False
        self._temp_end = 0
        probs = self._probs
        self._probs = []
        if end - start < self._min_speech:
            return []
        a = max(start - self._pad, self._prev_end, 0)
        b = min(end + self._pad, available)
        self._prev_end = b
        audio = self._slice(a, b) if self.keep_audio else None
        prob = float(np.clip(np.mean(probs), 0.0, 1.0)) if probs else 0.0
        return [SpeechSegment(start=a / SAMPLE_RATE, end=b / SAMPLE_RATE, probability=prob, stream=self.stream,
                              audio=audio)]

    # -- audio kept for segments -------------------------------------------------------------------
    def _keep(self, samples: np.ndarray) -> None:
        if self.keep_audio:
            self._history.append(samples.copy())
            self._hist_len += len(samples)

    def _trim_history(self) -> None:
        # Outside speech only the padding before a future start is needed.
        keep = self._pad + WINDOW
        while self._history and self._hist_len - len(self._history[0]) >= keep:
            self._hist_len -= len(self._history[0])
            self._hist_start += len(self._history[0])
            self._history.pop(0)

    def _slice(self, a: int, b: int) -> np.ndarray:
        audio = np.concatenate(self._history) if self._history else np.zeros(0, dtype=np.float32)
        lo = max(a - self._hist_start, 0)
        out: np.ndarray = np.ascontiguousarray(audio[lo : b - self._hist_start], dtype=np.float32)
        return out

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> VoiceActivity:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
