"""Calibration data for speech models: a folder of clips, drawn like the image calibration set.

:class:`CalibrationClips` lists the audio files of a folder (recursively, sorted), draws ``num`` of them
in a seeded order, decodes each to 16 kHz mono when it is reached, and skips and counts files that do
not decode. :func:`whisper_encoder_fill` turns a clip into the Whisper encoder's input in place, so the
calibration collector (:class:`edgert.calib.collect.ActivationCollector`, which takes any samples and a
``fill(sample, buffer)``) calibrates the encoder on real speech:

    clips = CalibrationClips("clips/", num=32)
    collector.run(clips, whisper_encoder_fill, np.zeros((1, 80, 3000), np.float32))
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgert.errors import CalibrationError, SourceError
from edgert.speech.audio import AUDIO_SUFFIXES, read_audio
from edgert.speech.features import N_SAMPLES, WhisperFeatures

__all__ = ["CalibrationClips", "whisper_encoder_fill"]

log = logging.getLogger(__name__)


@dataclass
class CalibrationClips:
    """``num`` clips (None: all) drawn from ``root`` with ``seed``; iterate for ``(path, audio)``."""

    root: str | Path
    num: int | None = 32
    seed: int = 0
    files: list[Path] = field(init=False)
    used: list[Path] = field(default_factory=list, init=False)
    skipped: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        base = Path(self.root)
        if not base.is_dir():
            raise CalibrationError(f"{base}: not a folder of audio clips ({', '.join(AUDIO_SUFFIXES)})")
        self.files = sorted(p for p in base.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES
                            and not any(part.startswith(".") for part in p.relative_to(base).parts))
        if not self.files:
            raise CalibrationError(f"{base}: no audio clips ({', '.join(AUDIO_SUFFIXES)}) in this folder")
        if self.num is not None and self.num < 1:
            raise CalibrationError(f"num must be >= 1, got {self.num}")

    def __len__(self) -> int:
        return len(self.files) if self.num is None else min(self.num, len(self.files))

    def __iter__(self) -> Iterator[tuple[Path, np.ndarray]]:
        self.used, self.skipped = [], {}
        order = np.random.default_rng(self.seed).permutation(len(self.files))
        for i in order:
            if len(self.used) >= len(self):
                return
            path = self.files[int(i)]
            try:
                audio = read_audio(path)
            except SourceError as exc:
                self.skipped[str(path)] = str(exc)
                log.warning("calibration: skipped %s", exc)
                continue
            self.used.append(path)
            yield path, audio


_FEATURES = WhisperFeatures()


def whisper_encoder_fill(sample: object, buffer: np.ndarray) -> None:
    """Write the log-mel of a ``(path, audio)`` sample (its first 30 s) into the encoder input ``buffer``."""
    if not isinstance(sample, tuple) or len(sample) != 2:
        raise CalibrationError(f"expected a (path, audio) sample from CalibrationClips, got {type(sample).__name__}")
    _FEATURES(np.asarray(sample[1], dtype=np.float32)[:N_SAMPLES], out=buffer)
