"""Frame sources chosen by URI: video files, images, folders, USB and CSI cameras, RTSP, GStreamer.

``open_source("video.mp4")`` and friends return a :class:`FrameSource`: a context manager whose
``read(out)`` returns the next BGR frame (written into ``out`` when its shape fits, so the pipeline's
frame buffers are reused) or None at the end. Every source reports ``width``, ``height`` and nominal
``fps`` once open.

Two kinds behave differently, on purpose:

- files (video, image, folder, glob) deliver every frame; a frame that cannot be decoded is skipped and
  counted (``skipped``); the end of the file ends the run. A video is read on a reader thread, so a file
  that stops delivering (a FIFO whose writer went quiet) is a *stall* after ``source.timeout_s`` (10 s by
  default): counted in ``stalls``, named in ``end_reason``, and it ends the source instead of hanging.
- live sources (cameras, RTSP, GStreamer) run a grabber thread that keeps only the newest frame: a frame
  the pipeline did not take in time is dropped and counted (``dropped``), so a slow consumer always
  sees the present, never a backlog. When the camera or stream fails, the grabber reconnects with
  exponential backoff and logs each attempt; the pipeline just waits for the next frame. No frame for
  ``source.timeout_s`` (5 s by default) is a stall: counted, logged, and the stream is reconnected
  (a grabber stuck inside a driver call is abandoned for a new one).

``stop()`` (the pipeline calls it at SIGINT/SIGTERM, from another thread) makes a waiting ``read()``
return None at once, whatever the source is blocked on.

URIs: ``path/to/video.mp4``, ``image.jpg``, ``folder/``, ``'images/*.jpg'``, ``/dev/video0``,
``v4l2:///dev/video0``, ``0`` (= /dev/video0), ``csi://0``, ``rtsp://host/stream``,
``http(s)://...`` (FFmpeg), ``gst://<pipeline ending in appsink>``.

The package, one idea a module: :mod:`~edgert.io.sources.base` (the :class:`FrameSource` interface, skip
reasons, timeouts, media time), :mod:`~edgert.io.sources.files` (video files, images),
:mod:`~edgert.io.sources.live` (:class:`LiveSource` and the camera/stream openers),
:mod:`~edgert.io.sources.gstreamer` (pipeline strings, :func:`gstreamer_available`) and
:mod:`~edgert.io.sources.registry` (the :data:`SOURCES` table and :func:`open_source`).
"""

from __future__ import annotations

from edgert.io.sources.base import (
    FILE_TIMEOUT_S,
    IMAGE_SUFFIXES,
    LIVE_TIMEOUT_S,
    SKIP_DAMAGED_END,
    SKIP_LARGE_IMAGE,
    SKIP_UNDECODABLE,
    SKIP_UNREADABLE_IMAGE,
    FrameSource,
    RepeatedWarning,
    media_time,
    time_base,
)
from edgert.io.sources.files import ImageFilesSource, VideoFileSource
from edgert.io.sources.gstreamer import csi_pipeline, gstreamer_available, rtsp_pipeline
from edgert.io.sources.live import LiveSource
from edgert.io.sources.registry import (
    SOURCES,
    SourceKind,
    open_source,
    register_source,
    source_help,
    source_kind,
    video_file_source,
)

__all__ = [
    "FILE_TIMEOUT_S",
    "IMAGE_SUFFIXES",
    "LIVE_TIMEOUT_S",
    "SKIP_DAMAGED_END",
    "SKIP_LARGE_IMAGE",
    "SKIP_UNDECODABLE",
    "SKIP_UNREADABLE_IMAGE",
    "SOURCES",
    "FrameSource",
    "ImageFilesSource",
    "LiveSource",
    "RepeatedWarning",
    "SourceKind",
    "VideoFileSource",
    "csi_pipeline",
    "gstreamer_available",
    "media_time",
    "open_source",
    "register_source",
    "rtsp_pipeline",
    "source_help",
    "source_kind",
    "time_base",
    "video_file_source",
]

