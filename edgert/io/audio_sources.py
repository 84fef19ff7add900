"""Audio sources as rows of the one source table (:data:`edgert.io.sources.SOURCES`).

A speech task reads 16 kHz mono chunks through the same :class:`~edgert.pipeline.Pipeline` as detection: a
"frame" of an audio source is one chunk (``speech.chunk_samples`` float32 samples), and :attr:`AudioFrames.meta`
says where it lies (:class:`~edgert.speech.audio.AudioChunk`: stream, start time, index, whether it is the
last of its file). The rows here are the only place an audio URI is understood:

- ``alsa://DEVICE`` and ``mic://N``: a live capture device (its own bounded queue; overruns are its drops);
- a folder holding audio files (``.wav``, ``.flac``, ``.ogg``): every clip, each its own stream;
- an audio file.

This module does not import :mod:`edgert.io.sources` (that table imports these rows), so the two never
import each other; the frame source here has the same members as a ``FrameSource``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgert.config import SourceConfig
from edgert.errors import SourceError
from edgert.io.uri import file_path_text, scheme

__all__ = ["AUDIO_ROWS", "AudioFrames", "is_audio_source"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK = 512  # speech.chunk_samples' default; the pipeline sets the config's with set_chunk()
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")  # edgert.speech.audio.AUDIO_SUFFIXES (a test keeps them equal)


class AudioFrames:
    """An :class:`~edgert.speech.audio.AudioSource` as a pipeline source: ``read()`` gives the next chunk's
    samples and sets :attr:`meta` to that chunk; None at the end."""

    live = False
    kind = "audio"
    audio = True  # the pipeline runs audio sources with a speech task only, and a speech task only on them

    def __init__(self, uri: str, make: Callable[[int], Any], chunk_samples: int, live: bool = False) -> None:
        self.uri = uri
        self.live = live
        self.kind = "audio-live" if live else "audio"
        self.width = 0
        self.height = 0
        self.chunk_samples = chunk_samples
        self.fps: float | None = 16000.0 / chunk_samples  # chunks per second of audio
        self.reconnects = 0
        self.stalls = 0
        self.end_reason: str | None = None
        self.ended_early = False
        self.meta: Any = None  # the AudioChunk of the last read
        self.current: str | None = None  # the file the last chunk came from (folders, files)
        self._make = make
        self._inner: Any = None
        self._chunks: Iterator[Any] | None = None
        self._stopped = False
        self._opened = False

    def set_chunk(self, samples: int) -> None:
        """Chunks of ``samples`` (``speech.chunk_samples``); before :meth:`open`."""
        if samples < 1:
            raise SourceError(f"{self.uri}: chunk size must be >= 1 sample, got {samples}")
        self.chunk_samples = int(samples)
        self.fps = 16000.0 / self.chunk_samples

    # -- the FrameSource members the pipeline reads -------------------------------------------------
    @property
    def dropped(self) -> int:
        return int(getattr(self._inner, "overruns", 0))

    @property
    def skipped(self) -> int:
        return int(getattr(self._inner, "skipped", 0))

    @property
    def skipped_by_reason(self) -> dict[str, int]:
        return {"unreadable_clips": self.skipped} if self.skipped else {}

    def open(self) -> None:
        self._inner = self._make(self.chunk_samples)
        self._chunks = iter(self._inner)
        self._opened = True

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        if self._chunks is None:
            raise SourceError(f"{self.uri}: read before open")
        if self._stopped:
            self.end_reason = "stopped"
            return None
        try:
            chunk = next(self._chunks)
        except StopIteration:
            self.end_reason = "end of input"
            return None
        self.meta = chunk
        self.current = chunk.stream if not self.live else None
        samples: np.ndarray = chunk.samples
        return samples

    def stop(self) -> None:
        self._stopped = True
        stop = getattr(self._inner, "_stop", None)  # a microphone's reader waits on it
        if stop is not None:
            stop.set()

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
            self._inner = None
        self._chunks = None

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uri": self.uri, "kind": self.kind, "live": self.live, "width": 0, "height": 0,
                               "fps": self.fps, "stalls": 0, "sample_rate": 16000,
                               "chunk_samples": self.chunk_samples}
        if self._inner is not None:
            out.update(self._inner.stats())
        if self.end_reason is not None:
            out["end_reason"] = self.end_reason
        return out

    def counters(self) -> dict[str, Any]:
        return {"skipped": self.skipped_by_reason, "dropped": self.dropped, "reconnects": 0,
                "end_reason": self.end_reason, "ended_early": False}

    def __enter__(self) -> AudioFrames:
        if not self._opened:
            self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_audio_source(source: Any) -> bool:
    """Whether a pipeline source gives audio chunks (a speech task's input)."""
    return bool(getattr(source, "audio", False))


def _is_audio_file(uri: str) -> bool:
    return file_path_text(uri).lower().endswith(AUDIO_SUFFIXES)


def _is_audio_folder(uri: str) -> bool:
    path = Path(file_path_text(uri)).expanduser()
    try:
        return path.is_dir() and any(p.suffix.lower() in AUDIO_SUFFIXES for p in path.iterdir())
    except OSError:
        return False


def _mic(uri: str, config: SourceConfig) -> AudioFrames:
    from edgert.speech.audio import MicSource

    return AudioFrames(uri, lambda n: MicSource(uri, n), DEFAULT_CHUNK, live=True)


def _folder(uri: str, config: SourceConfig) -> AudioFrames:
    from edgert.speech.audio import FolderSource

    path = Path(file_path_text(uri)).expanduser()
    return AudioFrames(uri, lambda n: FolderSource(path, n), DEFAULT_CHUNK)


def _file(uri: str, config: SourceConfig) -> AudioFrames:
    from edgert.speech.audio import FileSource

    path = Path(file_path_text(uri)).expanduser()  # FileSource says what is wrong with it, at open
    return AudioFrames(uri, lambda n: FileSource(path, n), DEFAULT_CHUNK)


#: (name, example, accepts, make) of each audio source kind; :mod:`edgert.io.sources` makes them rows of
#: its table, ahead of the image and video rows (a folder of clips is audio, not images).
AUDIO_ROWS: list[tuple[str, str, Callable[[str], bool], Callable[[str, SourceConfig], Any]]] = [
    ("audio-live", "alsa://DEVICE, mic://N", scheme("alsa://", "mic://"), _mic),
    ("audio-folder", "a folder of .wav/.flac/.ogg clips", _is_audio_folder, _folder),
    ("audio-file", "a .wav/.flac/.ogg file", _is_audio_file, _file),
]
