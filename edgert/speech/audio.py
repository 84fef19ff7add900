"""Audio sources by URI: files, folders of clips and microphones, as fixed-size 16 kHz mono chunks.

=========================  ===============================================================
``clip.wav``, ``file://``  a WAV/FLAC/OGG file (libsndfile through ``soundfile``); other rates
                           are resampled to 16 kHz and several channels are averaged to mono
``clips/``                 a folder of such files, one stream each, in name order; an unreadable
                           clip is skipped and counted
``alsa://default``         an ALSA capture device (``alsa://hw:1,0``, ``alsa://plughw:1``)
``mic://N``                capture device number N (sounddevice's index, ALSA card N for arecord)
=========================  ===============================================================

Microphones are read through ``sounddevice`` (PortAudio) when it loads, else through ``arecord``
(alsa-utils) as a subprocess; ``?via=arecord`` or ``?via=sounddevice`` picks one. A reader thread
fills a bounded queue; when the consumer falls behind, the oldest chunk is dropped and counted as an
overrun, and timestamps keep counting captured samples, so they never drift from the wall clock.
Files are never dropped.
"""

from __future__ import annotations

import abc
import logging
import queue
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from edgert._lazy import lazy_import
from edgert.errors import BackendUnavailable, EdgertError, SourceError, first_line

__all__ = [
    "AUDIO_SUFFIXES",
    "SAMPLE_RATE",
    "AudioChunk",
    "AudioSource",
    "FileSource",
    "FolderSource",
    "MicSource",
    "read_audio",
    "resample",
]

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MIN_SOURCE_RATE = 8000  # below telephone bandwidth there is nothing left for a 16 kHz model
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")


@dataclass(frozen=True)
class AudioChunk:
    """``samples`` (float32, -1..1, 16 kHz mono) starting ``start`` seconds into ``stream``.

    Every chunk of a stream has the source's chunk size except possibly the last one of a file, which
    has ``last=True`` so stages can flush what they hold.
    """

    samples: np.ndarray
    start: float
    stream: str
    index: int
    last: bool = False

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


# --------------------------------------------------------------------------------------------------
# Files


def _check_wav_header(path: Path) -> None:
    """Raise SourceError for a WAV whose data chunk is shorter than its header says.

    libsndfile reads such a file without complaint and returns fewer samples, which would silently
    cut the audio; a copy that stopped half-way is worth one clear line instead.
    """
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(12)
        if len(head) < 12 or head[:4] not in (b"RIFF", b"RF64") or head[8:12] != b"WAVE":
            return  # not a RIFF WAV: libsndfile decides
        pos = 12
        while pos + 8 <= size:
            fh.seek(pos)
            chunk_id, chunk_size = struct.unpack("<4sI", fh.read(8))
            if chunk_id == b"data":
                if head[:4] == b"RF64" or chunk_size in (0, 0xFFFFFFFF, 0x7FFFFFFF, 0x7FFFF000):
                    return  # streamed or 64-bit sizes: the header does not know the length
                available = size - (pos + 8)
                if chunk_size > available:
                    raise SourceError(
                        f"{path}: truncated WAV: the header declares {chunk_size} bytes of audio but the file holds "
                        f"{available}; re-copy or re-encode it"
                    )
                return
            pos += 8 + chunk_size + (chunk_size & 1)
        raise SourceError(f"{path}: truncated WAV: no audio data chunk before the end of the file")


def resample(audio: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Resample float32 mono ``audio`` from ``rate`` to ``target`` Hz with a band-limited filter.

    Always ``soxr`` (the ``speech`` extra), whatever else is installed: one resampler, so a transcript does
    not change with the install (scipy's came first when ``[track]`` had brought it).
    """
    if rate == target:
        return audio
    if rate < MIN_SOURCE_RATE:
        raise SourceError(
            f"sample rate {rate} Hz is too low for 16 kHz speech models (need >= {MIN_SOURCE_RATE} Hz); "
            "record at 16 kHz"
        )
    try:
        soxr = lazy_import("soxr", "resampling")
    except BackendUnavailable:
        raise SourceError(
            f"audio is {rate} Hz and no resampler is installed: pip install soxr (in 'edgert[speech]'), "
            "or convert it to 16 kHz"
        ) from None
    out = soxr.resample(audio, rate, target)
    result: np.ndarray = np.ascontiguousarray(out, dtype=np.float32)
    return result


def _open_checked(path: str | Path) -> tuple[Path, Any]:
    """The path, checked (exists, not a truncated WAV), and the soundfile module."""
    p = Path(path)
    if not p.exists():
        raise SourceError(f"{p}: audio file not found")
    if not p.is_file():
        raise SourceError(f"{p}: not a file")
    sf = lazy_import("soundfile", "reading audio files")
    _check_wav_header(p)
    return p, sf


def _read_error(p: Path, exc: Exception) -> SourceError:
    return SourceError(f"{p}: cannot read audio: {first_line(exc)}")


def read_audio(path: str | Path) -> np.ndarray:
    """The whole file as 16 kHz mono float32 (resampled and downmixed where needed)."""
    p, sf = _open_checked(path)
    try:
        data, rate = sf.read(str(p), dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as exc:
        raise _read_error(p, exc) from None
    channels = data.shape[1]
    mono = data[:, 0] if channels == 1 else data.mean(axis=1)
    if rate != SAMPLE_RATE:
        mono = resample(np.ascontiguousarray(mono, dtype=np.float32), int(rate))
        log.warning("%s: resampled %d Hz, %d channel(s) to 16000 Hz mono", p.name, rate, channels)
    elif channels != 1:
        log.warning("%s: mixed %d channels down to mono", p.name, channels)
    out: np.ndarray = np.ascontiguousarray(mono, dtype=np.float32)
    return out


# --------------------------------------------------------------------------------------------------
# Sources


class AudioSource(abc.ABC):
    """Chunks of 16 kHz mono audio. A context manager; iterate it for :class:`AudioChunk` s."""

    live = False

    def __init__(self, uri: str, chunk_samples: int) -> None:
        if chunk_samples < 1:
            raise SourceError(f"chunk size must be >= 1 sample, got {chunk_samples}")
        self.uri = uri
        self.chunk_samples = chunk_samples
        self.overruns = 0  # live sources: chunks dropped because the consumer fell behind
        self.dropped_samples = 0
        self.skipped = 0  # folder sources: clips that could not be read
        self.samples_read = 0

    @abc.abstractmethod
    def __iter__(self) -> Iterator[AudioChunk]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the device or file."""

    def __enter__(self) -> AudioSource:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        return {"uri": self.uri, "seconds": round(self.samples_read / SAMPLE_RATE, 3), "overruns": self.overruns,
                "dropped_seconds": round(self.dropped_samples / SAMPLE_RATE, 3), "skipped": self.skipped}

    def _chunks(self, audio: np.ndarray, stream: str) -> Iterator[AudioChunk]:
        n = self.chunk_samples
        count = max(1, -(-len(audio) // n))
        for i in range(count):
            piece = audio[i * n : (i + 1) * n]
            self.samples_read += len(piece)
            yield AudioChunk(piece, i * n / SAMPLE_RATE, stream, i, last=i == count - 1)


class FileSource(AudioSource):
    """One audio file. A 16 kHz mono file is read chunk by chunk, so an hour-long recording costs no
    more memory than a clip; any other file is decoded, downmixed and resampled whole at open."""

    def __init__(self, path: str | Path, chunk_samples: int = 512) -> None:
        super().__init__(str(path), chunk_samples)
        self.path, self._sf = _open_checked(path)
        try:
            info = self._sf.info(str(self.path))
        except (RuntimeError, self._sf.LibsndfileError) as exc:
            raise _read_error(self.path, exc) from None
        native = info.samplerate == SAMPLE_RATE and info.channels == 1
        self.audio: np.ndarray | None = None if native else read_audio(self.path)
        self.frames = int(info.frames) if native else len(self.audio) if self.audio is not None else 0

    def __iter__(self) -> Iterator[AudioChunk]:
        if self.audio is not None:
            yield from self._chunks(self.audio, str(self.path))
            return
        n = self.chunk_samples
        count = max(1, -(-self.frames // n))
        try:
            with self._sf.SoundFile(str(self.path)) as fh:
                for i in range(count):
                    piece = np.ascontiguousarray(fh.read(n, dtype="float32"), dtype=np.float32)
                    self.samples_read += len(piece)
                    yield AudioChunk(piece, i * n / SAMPLE_RATE, str(self.path), i, last=i == count - 1)
        except (RuntimeError, self._sf.LibsndfileError) as exc:
            raise _read_error(self.path, exc) from None


class FolderSource(AudioSource):
    """Every audio file of a folder, in name order, each its own stream. Unreadable clips are skipped."""

    def __init__(self, folder: str | Path, chunk_samples: int = 512) -> None:
        super().__init__(str(folder), chunk_samples)
        self.folder = Path(folder)
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
        if not self.files:
            raise SourceError(f"{self.folder}: no audio files ({', '.join(AUDIO_SUFFIXES)}) in this folder")

    def __iter__(self) -> Iterator[AudioChunk]:
        for path in self.files:
            try:
                audio = read_audio(path)
            except SourceError as exc:
                self.skipped += 1
                log.warning("skipped: %s", exc)
                continue
            yield from self._chunks(audio, str(path))


class MicSource(AudioSource):
    """A live capture device. A bounded queue between the capture thread and the consumer: when full,
    the oldest chunk is dropped and counted, so a slow consumer sees fresh audio with true timestamps."""

    live = True

    def __init__(self, uri: str, chunk_samples: int = 512, queue_seconds: float = 2.0) -> None:
        super().__init__(uri, chunk_samples)
        parts = urlsplit(uri)
        query = parse_qs(parts.query)
        via = query.get("via", ["auto"])[0]
        if "queue_s" in query:  # seconds of audio the capture may run ahead of the chain (default 2)
            try:
                queue_seconds = float(query["queue_s"][0])
            except ValueError:
                raise SourceError(f"{uri}: queue_s={query['queue_s'][0]!r}: expected seconds") from None
            if not 0 < queue_seconds <= 600:
                raise SourceError(f"{uri}: queue_s={queue_seconds:g}: expected seconds 0..600")
        target = (parts.netloc + parts.path) or "default"
        self._queue: queue.Queue[tuple[int, np.ndarray] | BaseException | None] = queue.Queue(
            maxsize=max(2, int(queue_seconds * SAMPLE_RATE / chunk_samples))
        )
        self._captured = 0  # samples captured by the device, dropped ones included: the clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stream: Any = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        if via not in ("auto", "sounddevice", "arecord"):
            raise SourceError(f"{uri}: via={via} is not a microphone reader. Note: use sounddevice or arecord")
        device: int | str = target
        if parts.scheme == "mic":
            if not target.isdigit():
                raise SourceError(f"{uri}: mic:// takes a device number, e.g. mic://0 (or use alsa://NAME)")
            device = int(target)
        sd_error = ""
        if via in ("auto", "sounddevice"):
            try:
                self._open_sounddevice(device)
                self.via = "sounddevice"
                return
            except _NoSoundDevice as exc:
                sd_error = str(exc)
                if via == "sounddevice":
                    raise SourceError(f"{uri}: {sd_error}") from None
        self._open_arecord(device, sd_error)
        self.via = "arecord"

    # -- readers -----------------------------------------------------------------------------------
    def _push(self, block: np.ndarray) -> None:
        with self._lock:
            start = self._captured
            self._captured += len(block)
        item = (start, block)
        while True:
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                try:
                    old = self._queue.get_nowait()
                except queue.Empty:
                    continue
                if isinstance(old, tuple):
                    self.overruns += 1
                    self.dropped_samples += len(old[1])

    def _open_sounddevice(self, device: int | str) -> None:
        try:
            sd = lazy_import("sounddevice", "microphone capture")
        except (BackendUnavailable, OSError) as exc:  # OSError: the PortAudio library itself is missing
            raise _NoSoundDevice(f"sounddevice unavailable ({first_line(exc)})") from None

        def callback(indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
            if status.input_overflow:  # the device's own buffer overflowed before we saw it
                self.overruns += 1
            self._push(indata[:, 0].copy())

        try:
            self._stream = sd.InputStream(device=None if device == "default" else device, channels=1,
                                          samplerate=SAMPLE_RATE, dtype="float32", blocksize=self.chunk_samples,
                                          callback=callback)
            self._stream.start()
        except (sd.PortAudioError, ValueError) as exc:  # no such device, or it refuses 16 kHz mono
            raise _NoSoundDevice(f"sounddevice cannot open it ({first_line(exc)})") from None

    def _open_arecord(self, device: int | str, sd_error: str) -> None:
        exe = shutil.which("arecord")
        if exe is None:
            why = f"{sd_error}; " if sd_error else ""
            raise SourceError(
                f"{self.uri}: no microphone reader: {why}arecord not found. Note: apt install libportaudio2 "
                "(for sounddevice) or alsa-utils (for arecord)"
            )
        # plughw converts rate and format in ALSA, as PortAudio does for sounddevice.
        alsa = f"plughw:{device}" if isinstance(device, int) else str(device)
        cmd = [exe, "-q", "-D", alsa, "-t", "raw", "-f", "S16_LE", "-c", "1", "-r", str(SAMPLE_RATE)]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise SourceError(f"{self.uri}: cannot start arecord: {exc}") from None
        self._thread = threading.Thread(target=self._arecord_reader, name="edgert-arecord", daemon=True)
        self._thread.start()

    def _arecord_reader(self) -> None:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        nbytes = self.chunk_samples * 2
        pending = b""
        while not self._stop.is_set():
            data = proc.stdout.read(nbytes - len(pending))
            if not data:
                break
            pending += data
            if len(pending) == nbytes:
                self._push(np.frombuffer(pending, dtype="<i2").astype(np.float32) / 32768.0)
                pending = b""
        if self._stop.is_set():
            return
        code = proc.wait()
        err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        # arecord's own verdict is its last line ("arecord: main:831: audio open error: ..."); the ALSA
        # library lines before it say why.
        msg = err.splitlines()[-1] if err else f"arecord exited with status {code}"
        what = "the microphone stopped" if self._captured else "cannot open the microphone with arecord"
        self._queue.put(SourceError(f"{self.uri}: {what}: {msg}"))

    # -- consumer ----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[AudioChunk]:
        index = 0
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=5.0)
            except queue.Empty:
                raise SourceError(f"{self.uri}: no audio from the microphone for 5 s") from None
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            start, samples = item
            self.samples_read += len(samples)
            yield AudioChunk(samples, start / SAMPLE_RATE, self.uri, index)
            index += 1

    def close(self) -> None:
        self._stop.set()
        if self._stream is not None:
            try:
                self._stream.stop()
                self._stream.close()
            finally:
                self._stream = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            for pipe in (self._proc.stdout, self._proc.stderr):
                if pipe is not None:
                    pipe.close()
            self._proc = None
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None


class _NoSoundDevice(EdgertError):
    """sounddevice is missing or sees no device: fall back to arecord."""
