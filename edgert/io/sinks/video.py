"""Annotated frames into a video file (``out.mp4``, ``.webm``, ``.avi``, ``.mkv``, ``.mov``).

``.mp4`` is H.264 where an H.264 encoder exists (PyAV's libx264, GStreamer through OpenCV), else OpenCV's
MPEG-4 Part 2, named as a fallback; ``.webm`` is VP9/VP8; ``.avi`` Motion-JPEG. :mod:`.encoders` has the order.
Through PyAV an MP4 is written fragmented (an index per group of frames), so a run killed before it closes
the file leaves a video that plays up to its last fragment (:data:`.encoders._FRAGMENTED` says why).
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
from edgert.io.sinks.base import (
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


#: Containers the sink writes, and the codec each gets when the best encoder for it is there.
VIDEO_SUFFIXES: dict[str, str] = {".mp4": "h264", ".m4v": "h264", ".mov": "h264", ".mkv": "h264", ".webm": "vp9",
                                  ".avi": "mjpg"}


class VideoFileSink(Sink):
    """Annotated frames into a video file (H.264 for .mp4/.mkv/.mov, VP9/VP8 for .webm, Motion-JPEG for .avi).

    ``prepare`` locks the file and has the first encoder that can (:func:`.encoders.encoder_chain`) write a
    throwaway probe beside it, so a container or codec nothing here can write fails before any existing
    video is truncated; a fallback most players refuse (``mp4v``) is a warning and ``note``. OpenCV reports no write
    errors, so the sink watches the file itself: deleted, or its filesystem full, and it fails (and the
    writer is released at once, which finalises what it can).
    """

    needs_image = True
    queue_size = 8  # encoding takes a few ms; a short queue rides out the odd slow frame
    lossless = True  # the video has every frame the events have

    def __init__(self, uri: str, path: Path, codec: str | None = None) -> None:
        from edgert.io.sinks.encoders import encoder_chain

        super().__init__(uri)
        self.path = path
        self._chain = encoder_chain(path.suffix, codec)
        if not self._chain:
            known = ", ".join(sorted({e.codec for e in encoder_chain(path.suffix)}))
            raise SinkError(f"{uri}: codec {codec!r} is not one {path.suffix} takes. Note: give one of {known}")
        self._asked = codec is not None  # a codec the user named is not a fallback to warn about
        self.encoder: Any = None  # the Encoder chosen at prepare
        self.note: str | None = None  # what the run's summary says about the file (its codec)
        self._writer: Any = None
        self._fd: int | None = None  # holds the lock, and tells deletion and a full disk
        self._created = False
        self._opened = False
        self._awaiting = False  # opened with no frame size yet: the writer starts on the first frame
        self._size = (0, 0)  # (0, 0) until the writer starts
        self._fps: float | None = None
        self._resized: np.ndarray | None = None
        self.frames = 0

    def prepare(self) -> None:
        if self._fd is not None:
            return
        from edgert.io.sinks.encoders import open_encoder

        self._fd, self._created = claim_file(self.path, "the video")
        probe = self.path.with_name(f".{self.path.stem}.edgert-probe-{os.getpid()}{self.path.suffix}")
        try:
            encoder, writer = open_encoder(self._chain, probe, 10.0, (64, 64))
            if writer is not None:
                writer.write(np.zeros((64, 64, 3), np.uint8))
                writer.release()
        finally:
            unlink_quietly(probe)
        if encoder is None:
            self.close()
            tried = ", ".join(e.label for e in self._chain)
            raise SinkError(f"{self.path}: no encoder here can write this video (tried {tried}). "
                            "Note: pip install 'edgert[video]' (PyAV), or write .avi")
        self.encoder = encoder
        self.note = encoder.label
        if encoder.fallback and not self._asked:
            self.note = f"{encoder.label}, a fallback: browsers and most phones do not play it"
            log.warning("%s: no H.264 encoder here, writing %s, which browsers and most phones do not play. "
                        "Note: pip install 'edgert[video]' (PyAV's libx264) for H.264", self.path, encoder.label)

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        self._fps = info.fps if info.fps and info.fps > 0 else None
        self._awaiting = True
        if (info.width or 0) > 0 and (info.height or 0) > 0:
            self._start((info.width, info.height))
        # else a live source still connecting (reconnected in the background): the writer starts on its first
        # frame, sized by it; until then the file is left as it was (a previous run's video is not truncated)

    def _start(self, size: tuple[int, int]) -> None:
        self._awaiting = False
        self._opened = True  # from here the file is ours to (re)write
        fps = self._fps if self._fps is not None else 10.0
        self._size = size
        if self.encoder.codec != "mjpg" and (size[0] % 2 or size[1] % 2):
            size = (size[0] // 2 * 2, size[1] // 2 * 2)  # 4:2:0 needs even sides: fit to one pixel less
            self._size = size
        writer = self.encoder.make(self.path, fps, size)
        if writer is None or not writer.isOpened():
            if writer is not None:
                writer.release()
            raise SinkError(f"{self.path}: {self.encoder.label} cannot write this video. Note: use .avi")
        self._writer = writer

    def write(self, result: FrameResult) -> None:
        if result.image is None:
            return
        if self._writer is None:
            if not self._awaiting:
                return
            self._start((int(result.image.shape[1]), int(result.image.shape[0])))
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
            log.info("wrote %d frames to %s (%s)", self.frames, self.path, self.note)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if self._created and not self._opened:
                unlink_quietly(self.path)


def is_video_file(uri: str) -> bool:
    return local_path(uri)[1].suffix.lower() in VIDEO_SUFFIXES


def from_uri(uri: str, title: str = "edgert") -> VideoFileSink:
    """``out.mp4``, ``out.mp4?codec=mp4v`` (or h264; vp9/vp8 for .webm)."""
    text, path = local_path(uri)
    from urllib.parse import parse_qs

    options = parse_qs(text.partition("?")[2])
    unknown = sorted(set(options) - {"codec"})
    if unknown:
        raise SinkError(f"{uri}: unknown option {unknown[0]!r}. Note: a video sink takes ?codec=NAME")
    codec = options.get("codec", [None])[-1]
    return VideoFileSink(uri, path, codec)
