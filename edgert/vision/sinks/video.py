"""Annotated frames into a video file through OpenCV's writer (``out.mp4``, ``.avi``, ``.mkv``, ``.mov``).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.errors import SinkError
from edgert.vision.sinks.base import (
    FrameResult,
    Sink,
    StreamInfo,
    claim_file,
    is_deleted,
    local_path,
    unlink_quietly,
)

__all__ = [
    "INDEX_BYTES_PER_FRAME",
    "VIDEO_RESERVE_BYTES",
    "VIDEO_SUFFIXES",
    "VideoFileSink",
    "from_uri",
    "is_video_file",
]

log = logging.getLogger(__name__)


#: Free space a video sink keeps so that it can still be finalised: what OpenCV's FFmpeg writer holds
#: before it writes (it was seen flushing in 256 KiB steps) and the container trailer, plus per frame
#: written its index entry (MP4 stsz/stco, AVI idx1: 16 bytes and less).
VIDEO_RESERVE_BYTES = 512 * 1024


INDEX_BYTES_PER_FRAME = 32


#: Containers and the FourCC that OpenCV's pip wheel (FFmpeg inside) can write for each.
VIDEO_SUFFIXES: dict[str, str] = {".mp4": "mp4v", ".m4v": "mp4v", ".mov": "mp4v", ".mkv": "mp4v", ".avi": "MJPG"}


class VideoFileSink(Sink):
    """Annotated frames into a video file (MPEG-4 Part 2 for .mp4/.mkv/.mov, Motion-JPEG for .avi).

    ``prepare`` locks the file and has OpenCV write a throwaway probe beside it, so a container or
    codec this OpenCV cannot write fails before any existing video is truncated. OpenCV reports no write
    errors, so the sink watches the file itself: deleted, or its filesystem full, and it fails (and the
    writer is released at once, which finalises what it can).
    """

    needs_image = True
    queue_size = 8  # encoding takes a few ms; a short queue rides out the odd slow frame
    lossless = True  # the video has every frame the events have

    def __init__(self, uri: str, path: Path, fourcc: str | None = None) -> None:
        super().__init__(uri)
        self.path = path
        self.fourcc = fourcc or VIDEO_SUFFIXES.get(path.suffix.lower(), "mp4v")
        self._writer: Any = None
        self._fd: int | None = None  # holds the lock, and tells deletion and a full disk
        self._created = False
        self._opened = False
        self._size = (0, 0)
        self._resized: np.ndarray | None = None
        self.frames = 0

    def prepare(self) -> None:
        if self._fd is not None:
            return
        cv2 = lazy_import("cv2", "writing video files")
        self._fd, self._created = claim_file(self.path, "the video")
        probe = self.path.with_name(f".{self.path.stem}.edgert-probe-{os.getpid()}{self.path.suffix}")
        try:
            writer = cv2.VideoWriter(str(probe), cv2.VideoWriter_fourcc(*self.fourcc), 10.0, (64, 64))
            ok = writer.isOpened()
            writer.release()
        finally:
            unlink_quietly(probe)
        if not ok:
            self.close()
            raise SinkError(f"{self.path}: OpenCV cannot write {self.fourcc} video here. Note: use .mp4 or .avi")

    def open(self, info: StreamInfo) -> None:
        cv2 = lazy_import("cv2", "writing video files")
        if info.width <= 0 or info.height <= 0:
            raise SinkError(f"{self.path}: the source reported no frame size")
        self.prepare()
        fps = info.fps if info.fps and info.fps > 0 else 10.0
        self._size = (info.width, info.height)
        self._opened = True  # from here the file is ours to (re)write
        writer = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*self.fourcc), fps, self._size)
        if not writer.isOpened():
            writer.release()
            raise SinkError(f"{self.path}: OpenCV cannot write {self.fourcc} video here. Note: use .mp4 or .avi")
        self._writer = writer

    def write(self, result: FrameResult) -> None:
        if self._writer is None or result.image is None:
            return
        self._check_file()
        image = result.image
        if (image.shape[1], image.shape[0]) != self._size:  # folders of mixed sizes: fit the first size
            cv2 = lazy_import("cv2")
            if self._resized is None:
                self._resized = np.empty((self._size[1], self._size[0], 3), np.uint8)
            image = cv2.resize(image, self._size, dst=self._resized)
        self._writer.write(image)
        self.frames += 1

    def _check_file(self) -> None:
        if self._fd is None:
            return
        if is_deleted(self._fd):
            raise SinkError(f"{self.path}: the video was deleted while the run wrote it")
        try:
            vfs = os.fstatvfs(self._fd)
            size = os.fstat(self._fd).st_size
        except OSError:
            return
        # Stop while the rest still fits: OpenCV's writer ignores write errors, and a video whose index
        # (MP4 moov, AVI idx1) cannot be written at the end does not play. Keep room for the writer's
        # buffer, a few frames and the index.
        free = vfs.f_bavail * vfs.f_frsize
        per_frame = size / self.frames if self.frames else 0.0
        if free < VIDEO_RESERVE_BYTES + 4 * per_frame + INDEX_BYTES_PER_FRAME * self.frames:
            raise SinkError(f"{self.path}: writing the video failed: {os.strerror(errno.ENOSPC)} "
                            f"({free // 1024} KiB left); it was stopped and finalised at frame {self.frames}")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None
            log.info("wrote %d frames to %s", self.frames, self.path)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if self._created and not self._opened:
                unlink_quietly(self.path)


def is_video_file(uri: str) -> bool:
    return local_path(uri)[1].suffix.lower() in VIDEO_SUFFIXES


def from_uri(uri: str, title: str = "edgert") -> VideoFileSink:
    return VideoFileSink(uri, local_path(uri)[1])
