"""One validated result type per speech stage: SpeechSegment, WakeEvent, Transcript.

Times are seconds from the start of the stream (file or microphone) they came from. Each type checks
itself at construction and turns into a JSON-ready dict with ``to_dict()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["SpeechSegment", "Transcript", "WakeEvent"]


def _check_span(start: float, end: float, what: str) -> None:
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ValueError(f"{what}: start and end must be finite, got {start}, {end}")
    if start < 0 or end < start:
        raise ValueError(f"{what}: expected 0 <= start <= end, got start={start}, end={end}")


@dataclass(frozen=True)
class SpeechSegment:
    """A stretch of speech found by the voice-activity detector.

    ``audio`` (16 kHz mono float32, padding included) is kept for the next stage and left out of
    ``to_dict()``.
    """

    start: float
    end: float
    probability: float  # mean speech probability over the segment's windows
    stream: str = ""
    audio: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_span(self.start, self.end, "SpeechSegment")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"SpeechSegment: probability must be in 0..1, got {self.probability}")
        if self.audio is not None and (self.audio.ndim != 1 or self.audio.dtype != np.float32):
            got = f"{self.audio.dtype}{list(self.audio.shape)}"
            raise ValueError(f"SpeechSegment: audio must be float32 [samples], got {got}")

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {"type": "segment", "stream": self.stream, "start": round(self.start, 3), "end": round(self.end, 3),
                "probability": round(self.probability, 4)}


@dataclass(frozen=True)
class WakeEvent:
    """A wake word heard: its name, the classifier's score and when (the end of the scored window)."""

    word: str
    score: float
    time: float
    stream: str = ""

    def __post_init__(self) -> None:
        if not self.word:
            raise ValueError("WakeEvent: word must not be empty")
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"WakeEvent: score must be in 0..1, got {self.score}")
        if not (math.isfinite(self.time) and self.time >= 0):
            raise ValueError(f"WakeEvent: time must be >= 0, got {self.time}")

    def to_dict(self) -> dict[str, Any]:
        return {"type": "wake", "stream": self.stream, "word": self.word, "score": round(self.score, 4),
                "time": round(self.time, 3)}


@dataclass(frozen=True)
class Transcript:
    """Whisper's text for one stretch of audio, with the stretch's start and end times."""

    text: str
    start: float
    end: float
    tokens: tuple[int, ...] = ()
    stream: str = ""
    truncated: bool = False  # decoding stopped at max_tokens before the end token
    avg_logprob: float | None = None  # mean log-probability of the kept tokens (end token included)
    no_speech_prob: float | None = None  # Whisper's own estimate that there was no speech
    no_speech: bool = False  # taken for silence (no_speech_prob high and avg_logprob low): text dropped
    segments: tuple[tuple[float, float, str], ...] = ()  # (start, end, text) of each 30 s window decoded

    def __post_init__(self) -> None:
        _check_span(self.start, self.end, "Transcript")
        if any(t < 0 for t in self.tokens):
            raise ValueError("Transcript: token ids must be >= 0")
        if self.no_speech_prob is not None and not 0.0 <= self.no_speech_prob <= 1.0:
            raise ValueError(f"Transcript: no_speech_prob must be in 0..1, got {self.no_speech_prob}")

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {"type": "transcript", "stream": self.stream, "start": round(self.start, 3),
                "end": round(self.end, 3), "text": self.text, "truncated": self.truncated,
                "avg_logprob": r(self.avg_logprob), "no_speech_prob": r(self.no_speech_prob),
                "segments": [{"start": round(a, 3), "end": round(b, 3), "text": t} for a, b, t in self.segments]}
