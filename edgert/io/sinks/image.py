"""Images: the last annotated frame in one file (``out.jpg``) or one image per frame in a folder (``frames/``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import numpy as np

from edgert._lazy import lazy_import
from edgert.errors import SinkError
from edgert.io.sinks.base import (
    FrameResult,
    Sink,
    StreamInfo,
    check_writable,
    claim_file,
    is_deleted,
    local_path,
    unlink_quietly,
)

__all__ = ["ImageFileSink", "ImageFolderSink", "file_from_uri", "folder_from_uri", "is_folder", "is_image_file"]

log = logging.getLogger(__name__)


def _query(uri: str, text: str, allowed: Sequence[str]) -> tuple[str, dict[str, str]]:
    """``path?key=value`` split into the path and its options; an unknown option is a one-line error."""
    path, _, query = text.partition("?")
    options: dict[str, str] = {}
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key not in allowed:
            raise SinkError(f"{uri}: unknown option {key!r}. Note: valid options are {', '.join(allowed) or 'none'}")
        options[key] = values[-1]
    return path, options


def _number(uri: str, key: str, value: str, kind: type, zero_ok: bool = False) -> Any:
    try:
        number = kind(value)
    except ValueError:
        number = -1
    if number < 0 or (number == 0 and not zero_ok):
        raise SinkError(f"{uri}: {key} expects {'a whole number' if kind is int else 'a number'} "
                        f"{'>= 0' if zero_ok else '> 0'}, got {value!r}")
    return number


class ImageFileSink(Sink):
    """The latest annotated frame in one image file (``out.jpg``), replaced atomically.

    The file is rewritten at most every ``interval`` seconds while frames come (0: every frame it gets), and
    once more at close, so it ends as the last frame of the run. Readers never see a partial image: each
    version is written to a temporary name and renamed over the file.
    """

    needs_image = True
    queue_size = 4  # write() is a copy between file writes: the queue rarely fills

    def __init__(self, uri: str, path: Path, interval: float = 1.0) -> None:
        super().__init__(uri)
        self.path = path
        self.interval = interval
        self._latest: np.ndarray | None = None
        self._dirty = False
        self._last_write: float | None = None  # monotonic time of the last write; None: write the first frame
        self.writes = 0

    def open(self, info: StreamInfo) -> None:
        self.prepare()

    def prepare(self) -> None:
        """The format and the folder are checked before any sink of the run truncates its output."""
        from edgert.vision.image_io import encode_image

        lazy_import("cv2", "writing images")
        try:
            encode_image(np.zeros((2, 2, 3), np.uint8), self.path.suffix)  # the format is writable
        except Exception as exc:
            raise SinkError(f"{self.path}: {exc}") from None
        check_writable(self.path, "the image")

    def write(self, result: FrameResult) -> None:
        if result.image is None:
            return
        if self._latest is None or self._latest.shape != result.image.shape:
            self._latest = np.empty_like(result.image)
        np.copyto(self._latest, result.image)  # the worker reuses result.image after this returns
        self._dirty = True
        now = time.monotonic()
        if self._last_write is None or now - self._last_write >= self.interval:
            self._flush(now)

    def _flush(self, now: float) -> None:
        from edgert.vision.image_io import write_image

        if self._latest is None or not self._dirty:
            return
        try:
            write_image(self.path, self._latest)
        except Exception as exc:
            raise SinkError(str(exc)) from None
        self._dirty = False
        self._last_write = now
        self.writes += 1

    def close(self) -> None:
        self._flush(time.monotonic())


LOCK_NAME = ".edgert-lock"


def _identity(folder: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class ImageFolderSink(Sink):
    """One annotated image per frame (or per ``every`` frames) in a folder: ``frame_000042.jpg``.

    For image sources each file takes its source image's name instead (``bus.jpg`` -> ``bus.jpg``), so a
    folder in gives the same folder annotated. Every file is written whole (temporary name, then rename).
    """

    needs_image = True
    lossless = True  # a folder of frames is a record, like a video: the pipeline waits rather than drop one
    queue_size = 32  # encoding a JPEG takes a few ms: a longer queue rides out bursts

    def __init__(self, uri: str, folder: Path, every: int = 1, suffix: str = ".jpg") -> None:
        super().__init__(uri)
        self.folder = folder
        self.every = every
        self.suffix = suffix if suffix.startswith(".") else f".{suffix}"
        self.written = 0
        self._lock_fd: int | None = None  # a lock file inside the folder: one run per folder, and a folder
        self._lock_created = False  # removed or moved mid-run is noticed, not silently made again
        self._identity: tuple[int, int] | None = None

    def open(self, info: StreamInfo) -> None:
        self.prepare()

    def prepare(self) -> None:
        """The format and the folder are checked before any sink of the run truncates its output."""
        from edgert.vision.image_io import encode_image

        lazy_import("cv2", "writing images")
        try:
            encode_image(np.zeros((2, 2, 3), np.uint8), self.suffix)
        except Exception as exc:
            raise SinkError(f"{self.uri}: {exc}") from None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"{self.folder}: cannot make the folder: {exc.strerror or exc}") from None
        if not os.access(self.folder, os.W_OK):
            raise SinkError(f"{self.folder}: folder is not writable")
        if self._lock_fd is None:
            self._lock_fd, self._lock_created = claim_file(self.folder / LOCK_NAME, "the folder's lock")
            self._identity = _identity(self.folder)

    def name_for(self, result: FrameResult) -> str:
        if result.file:
            return Path(result.file).stem + self.suffix
        return f"frame_{result.index:06d}{self.suffix}"

    def write(self, result: FrameResult) -> None:
        from edgert.atomic_file import replace_file
        from edgert.vision.image_io import encode_image

        if result.image is None or result.index % self.every:
            return
        if self._lock_fd is not None and (is_deleted(self._lock_fd) or _identity(self.folder) != self._identity):
            raise SinkError(f"{self.folder}: the folder was removed during the run; no frame is written from here")
        target = self.folder / self.name_for(result)
        try:
            # Never make the folder here: a folder taken away mid-run must not be made again.
            replace_file(target, encode_image(result.image, target.suffix), make_folder=False)
        except OSError as exc:
            raise SinkError(f"{target}: cannot write the image: {exc.strerror or exc}") from None
        except Exception as exc:
            raise SinkError(str(exc)) from None
        self.written += 1

    def close(self) -> None:
        if self._lock_fd is not None:
            if self._lock_created:
                unlink_quietly(self.folder / LOCK_NAME)
            os.close(self._lock_fd)
            self._lock_fd = None
        if self.written:
            log.info("wrote %d images to %s", self.written, self.folder)


def is_folder(uri: str) -> bool:
    """A folder sink: the path ends in a slash, or names a folder that exists (and has no suffix)."""
    path_text, target = local_path(uri)
    bare = path_text.partition("?")[0]
    return bare.endswith(("/", os.sep)) or (target.is_dir() and not target.suffix)


def is_image_file(uri: str) -> bool:
    from edgert.vision.image_io import IMAGE_WRITE_SUFFIXES

    return local_path(uri)[1].suffix.lower() in IMAGE_WRITE_SUFFIXES


def folder_from_uri(uri: str, title: str = "edgert") -> ImageFolderSink:
    folder, options = _query(uri, local_path(uri)[0], ("every", "format"))
    every = _number(uri, "every", options["every"], int) if "every" in options else 1
    return ImageFolderSink(uri, Path(folder).expanduser(), every, options.get("format", "jpg"))


def file_from_uri(uri: str, title: str = "edgert") -> ImageFileSink:
    file, options = _query(uri, local_path(uri)[0], ("interval",))
    interval = _number(uri, "interval", options["interval"], float, zero_ok=True) if "interval" in options else 1.0
    return ImageFileSink(uri, Path(file).expanduser(), interval)
