"""Video files on a Jetson, decoded by the hardware decoder inside the capture worker.

JetPack's OpenCV is built with GStreamer, so a worker can hand a file to ``nvv4l2decoder`` (NVDEC) instead of
FFmpeg's software decoders, which on an Orin's Arm cores cost more than the detector itself at a few streams
(DeepStream decodes the same way: ``nvv4l2decoder`` into NVMM, ``nvvidconv`` out of it). ``parsebin`` finds the
container's demuxer and the stream's parser, so one pipeline covers MP4, MKV and AVI with H.264 or H.265.
The frames come back to system memory as BGR for the worker's ring; appsink keeps every buffer (a file must not
drop frames) and runs unsynchronised (as fast as the decoder goes, paced by the ring's back-pressure).

When the decoder cannot take the stream (MJPEG, MPEG-4 part 2 on some JetPacks), the worker falls back to the
FFmpeg path and says so once. This path is written for JetPack and cannot run on a desktop: its pipeline
string is tested there, the decode only on a Jetson.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from edgert.errors import SourceError
from edgert.io.sources import (
    SOURCES,
    FrameSource,
    VideoFileSource,
    gstreamer_available,
    open_source,
    video_file_source,
)
from edgert.io.sources.files import open_capture
from edgert.io.sources.gstreamer import jetson_file_pipeline

__all__ = ["GstVideoFileSource", "worker_source"]

log = logging.getLogger(__name__)


class GstVideoFileSource(VideoFileSource):
    """A video file read through :func:`~edgert.io.sources.gstreamer.jetson_file_pipeline` (the pipeline
    strings live with the other sources'); falls back to FFmpeg when GStreamer cannot."""

    kind = "video"

    def __init__(self, uri: str, path: Path, loop: bool = False, timeout: float | None = None,
                 realtime: bool = False, phase: float = 0.0) -> None:
        super().__init__(uri, path, loop, timeout, realtime=realtime, phase=phase)
        self.hardware = True

    def open(self) -> None:
        try:
            super().open()
        except SourceError as exc:
            if not self.hardware:
                raise
            log.warning("%s: the hardware decoder cannot take it (%s); decoding with FFmpeg", self.path, exc)
            self.hardware = False
            super().open()

    def _open_blocking(self, arg: Any) -> tuple[Any, np.ndarray]:
        if not self.hardware:
            return super()._open_blocking(arg)
        import cv2

        return open_capture(jetson_file_pipeline(str(self.path)),
                            f"{self.path}: GStreamer could not open it with nvv4l2decoder",
                            f"{self.path}: nvv4l2decoder delivered no frame", cv2.CAP_GSTREAMER)

    def info(self) -> dict[str, Any]:
        info = super().info()
        info["decoder"] = "nvv4l2decoder" if self.hardware else "ffmpeg"
        return info


def worker_source(config: Any) -> FrameSource:
    """The source a capture worker opens: on a Jetson with GStreamer a video file goes to the hardware
    decoder; everything else is :func:`~edgert.io.sources.open_source`'s."""
    uri = config.uri.strip()
    row = next(row for row in SOURCES if row.accepts(uri)) if uri else None
    if row is not None and row.name == "video" and gstreamer_available():
        from edgert.platform import jetson_info

        if jetson_info().get("is_jetson"):  # realtime and its phase too (before: dropped here, so --realtime was not)
            return video_file_source(uri, config, GstVideoFileSource)
    return open_source(config)
