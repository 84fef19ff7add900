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
"""

from __future__ import annotations

import abc
import glob
import logging
import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.config import SourceConfig
from edgert.errors import SourceError, last_line
from edgert.redact import expand_env, redact
from edgert.vision.audio_sources import AUDIO_ROWS
from edgert.vision.uri import ARGUS, NETWORK, always, file_path_text, insert_row, local_file, no_needs, nothing, scheme

__all__ = [
    "FILE_TIMEOUT_S",
    "IMAGE_SUFFIXES",
    "LIVE_TIMEOUT_S",
    "SKIP_DAMAGED_END",
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
]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".pgm", ".ppm"})

#: rtspsrc jitter buffer: small, so a late packet is dropped rather than delaying every frame after it.
RTSP_LATENCY_MS = 200

#: Consecutive failed reads after which a video file is considered unreadable from there on.
MAX_CONSECUTIVE_BAD_FRAMES = 25

#: Reasons a file source skips frames (keys of ``FrameSource.skipped_by_reason``).
SKIP_UNDECODABLE = "undecodable_frame"  # a frame inside the video failed to decode; later ones did
SKIP_DAMAGED_END = "damaged_end"  # frames the container lists after the point where decoding stopped for good
SKIP_UNREADABLE_IMAGE = "unreadable_image"  # an image file of a folder or glob that does not decode


class RepeatedWarning:
    """A warning that may happen many times: logged the first time, counted after, summed up at the end.

    A damaged video or a folder of broken images would otherwise print the same line for every frame.
    """

    def __init__(self, logger: logging.Logger, message: str) -> None:
        self.logger = logger
        self.message = message  # %-format with the first occurrence's arguments
        self.count = 0

    def __call__(self, *args: Any) -> None:
        self.count += 1
        if self.count == 1:
            self.logger.warning(self.message + " (further ones are counted, not logged)", *args)
        else:
            self.logger.debug(self.message, *args)

    def summary(self, what: str) -> None:
        """Log the total once (when there were more than one), then start counting afresh."""
        if self.count > 1:
            self.logger.warning("%s: %d in all", what, self.count)
        self.count = 0


#: Seconds without a frame after which a source has stalled (``source.timeout_s`` overrides both).
FILE_TIMEOUT_S = 10.0
LIVE_TIMEOUT_S = 5.0


def _cv2() -> Any:
    return lazy_import("cv2", "video and camera sources")


def gstreamer_available() -> bool:
    """Whether this OpenCV can run GStreamer pipelines (JetPack's can, the pip wheels cannot)."""
    try:
        info = _cv2().getBuildInformation()
    except Exception:  # BackendUnavailable, or an odd build: either way no GStreamer
        return False
    match = re.search(r"GStreamer:\s*(\S+)", info)
    return bool(match and match.group(1).upper().startswith("YES"))


# --------------------------------------------------------------------------------------------------
# GStreamer pipeline strings (pure functions: tested without GStreamer)


def _framerate(fps: float) -> str:
    nominal = round(fps * 1.001)
    if abs(fps - fps // 1) > 1e-6 and abs(fps - nominal * 1000 / 1001) < 0.01:
        return f"{nominal * 1000}/1001"  # NTSC rates: 29.97 means 30000/1001
    frac = Fraction(fps).limit_denominator(1001)
    return f"{frac.numerator}/{frac.denominator}"


def csi_pipeline(sensor_id: int, width: int = 1280, height: int = 720, fps: float = 30.0,
                 sensor_mode: int | None = None, flip: int = 0) -> str:
    """nvarguscamerasrc (Jetson ISP) -> NVMM NV12 -> nvvidconv (flip, to BGRx) -> BGR appsink."""
    mode = f" sensor-mode={sensor_mode}" if sensor_mode is not None else ""
    return (
        f"nvarguscamerasrc sensor-id={sensor_id}{mode} ! "
        f"video/x-raw(memory:NVMM), width=(int){width}, height=(int){height}, "
        f"framerate=(fraction){_framerate(fps)}, format=(string)NV12 ! "
        f"nvvidconv flip-method={flip} ! "
        f"video/x-raw, width=(int){width}, height=(int){height}, format=(string)BGRx ! "
        "videoconvert ! video/x-raw, format=(string)BGR ! "
        "appsink drop=true max-buffers=1 sync=false"
    )


def rtsp_pipeline(uri: str, latency_ms: int = RTSP_LATENCY_MS, jetson: bool = False, codec: str = "h264") -> str:
    """rtspsrc with a small jitter buffer that drops late packets, decoded to BGR for appsink.

    On a Jetson the hardware decoder (nvv4l2decoder) writes NVMM memory, which nvvidconv brings back to
    system memory; elsewhere decodebin picks whatever decoder is installed.
    """
    head = f"rtspsrc location={uri} latency={latency_ms} drop-on-latency=true ! "
    if jetson:
        depay = {"h264": "rtph264depay ! h264parse", "h265": "rtph265depay ! h265parse"}[codec]
        body = f"{depay} ! nvv4l2decoder ! nvvidconv ! video/x-raw, format=(string)BGRx ! "
    else:
        body = "decodebin ! "
    return head + body + "videoconvert ! video/x-raw, format=(string)BGR ! appsink drop=true max-buffers=1 sync=false"


# --------------------------------------------------------------------------------------------------
# The interface


class FrameSource(abc.ABC):
    """A source of BGR frames. Use as a context manager; ``read()`` returns None at the end."""

    live: bool = False
    kind: str = "?"

    def __init__(self, uri: str) -> None:
        self.uri = redact(uri)  # what logs, summaries and sinks show; openers keep the real URI to themselves
        self.width = 0
        self.height = 0
        self.fps: float | None = None  # nominal frames per second; None when the source has none
        self.dropped = 0  # live sources: stale frames replaced before the pipeline took them
        self.skipped = 0  # frames that could not be decoded (all reasons)
        self.skipped_by_reason: dict[str, int] = {}  # the same by reason (SKIP_* above)
        self.reconnects = 0
        #: Why ``read()`` returned None: "end of input" at a normal end, else what cut the input short
        #: (a damaged video, a stall: "stalled: ...", a stop: "stopped"). None while the source still delivers.
        self.end_reason: str | None = None
        #: Whether the input ended before its end (damage): ``end_reason`` then says why.
        self.ended_early = False
        self.stalls = 0  # times no frame came within the read timeout
        #: Media time (seconds) of the frame ``read()`` last returned, on the source's own clock (a file's
        #: timestamps, a live source's capture clock); None: the source has none (the pipeline then counts
        #: frames at ``fps``). Analytics (dwell, track ages) run on it; :data:`time_base` says which it is.
        self.frame_time: float | None = None
        self._opened = False

    #: What ``frame_time`` is, for summaries: "media" (a file's own timestamps, or frame index / fps) or
    #: "capture clock" (live sources: wall-clock seconds when the frame arrived).
    time_base: str = "media"

    @abc.abstractmethod
    def open(self) -> None:
        """Open the source; raise :class:`SourceError` (one line) when it cannot be."""

    @abc.abstractmethod
    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        """The next frame (in ``out`` when its shape fits), or None when the source has ended."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Make a blocked ``read()`` return None soon (called from another thread)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"uri": self.uri, "kind": self.kind, "live": self.live, "width": self.width,
                                "height": self.height, "fps": self.fps, "stalls": self.stalls}
        if self.end_reason is not None:
            info["end_reason"] = self.end_reason
        return info

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` frames skipped for ``reason``."""
        if count > 0:
            self.skipped += count
            self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + count

    def counters(self) -> dict[str, Any]:
        """What the source counted, for summaries: skips by reason, drops, reconnects, why it ended."""
        return {"skipped": dict(self.skipped_by_reason), "dropped": self.dropped, "reconnects": self.reconnects,
                "end_reason": self.end_reason, "ended_early": self.ended_early}

    def __enter__(self) -> FrameSource:
        if not self._opened:
            self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def media_time(source: Any, index: int, clock: float) -> float:
    """Media time of frame ``index`` (the pipeline's count) just read from ``source``: the source's own
    ``frame_time``; else, for a file, ``index / fps`` (30 when it has no rate), for a live source ``clock``.
    Any object with ``read()`` may be a source; one without these attributes is judged by ``live``."""
    t = getattr(source, "frame_time", None)
    if t is not None:
        return float(t)
    if getattr(source, "live", False):
        return clock
    return index / float(getattr(source, "fps", None) or 30.0)


def time_base(source: Any) -> str:
    """What :func:`media_time` is for ``source``, as summaries say it: "media" or "capture clock"."""
    if getattr(source, "live", False):
        return "capture clock"
    return str(getattr(source, "time_base", None) or "media")


def _into(out: np.ndarray | None, frame: np.ndarray) -> np.ndarray:
    """``frame`` copied into ``out`` when the shapes agree, else ``frame`` itself."""
    if out is not None and out.shape == frame.shape and out.dtype == frame.dtype:
        np.copyto(out, frame)
        return out
    return frame


# --------------------------------------------------------------------------------------------------
# Files


class _BlockingCalls:
    """One thread that runs blocking calls (OpenCV opens and reads) so the caller waits with a timeout.

    ``call`` returns ``("ok", value)``, ``("timeout", None)`` when the call did not finish in time, or
    ``("stopped", None)`` once :meth:`stop` was called (from any thread). A call that timed out may still
    be running: ``busy`` says so, and its result is thrown away.
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._job: tuple[Callable[[Any], Any], Any] | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._done = False
        self.busy = False
        self._stopping = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[Any], Any], arg: Any, timeout: float) -> tuple[str, Any]:
        with self._cond:
            if self._stopping:
                return "stopped", None
            if self.busy:  # the last call is still stuck: a second one would only queue behind it
                return "timeout", None
            self._job = (fn, arg)
            self.busy = True
            self._done = False
            self._cond.notify_all()
            deadline = time.monotonic() + timeout
            while not self._done:
                if self._stopping:
                    return "stopped", None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout", None
                self._cond.wait(remaining)
            self._done = False
            result, error = self._result, self._error
            self._result = self._error = None
        if error is not None:
            raise error
        return "ok", result

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._closed:
                    self._cond.wait()
                if self._job is None:
                    return
                fn, arg = self._job
                self._job = None
            try:
                result, error = fn(arg), None
            except BaseException as exc:  # handed to the caller, raised there
                result, error = None, exc
            with self._cond:
                self._result, self._error = result, error
                self._done = True
                self.busy = False
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class VideoFileSource(FrameSource):
    """A video file: every frame in order; undecodable frames are counted skips; ``loop`` restarts it.

    A FIFO (or any path that is not a regular file) is opened and read on a reader thread: a read that
    takes longer than ``timeout`` seconds (a writer that stopped delivering) is a stall that ends the
    source, and ``stop()`` ends a waiting read at once. A regular file is read in the caller's own thread:
    its reads end (a frame, or the end of the file), and handing every frame to another thread and back
    cost a quarter of the host time of 8 streams on the H200 (docs/pipeline.md). ``stop()`` then takes
    effect at the next read.
    """

    kind = "video"

    def __init__(self, uri: str, path: Path, loop: bool = False, timeout: float | None = None) -> None:
        super().__init__(uri)
        self.path = path
        self.loop = loop
        self.timeout = timeout if timeout is not None else FILE_TIMEOUT_S
        self._cap: Any = None
        self._first: np.ndarray | None = None
        self._frame_count = 0
        self._bad_frame = RepeatedWarning(log, "%s: frame %d cannot be decoded, skipped")
        self._consumed = 0  # frames of this pass through the file: delivered or counted as undecodable
        self._calls: _BlockingCalls | None = None
        self._direct = False  # a regular file: read in the caller's thread
        self._stopping = False
        self._time_offset = 0.0  # media time of the passes before this one (a looped file keeps counting up)
        self._first_time = 0.0

    def _stamp(self, cap: Any) -> None:
        """``frame_time`` of the frame just read: the container's timestamp, or its place / fps when the
        container has none (or goes backwards); frames that failed to decode still take their time slot."""
        cv2 = _cv2()
        fps = self.fps or float(cap.get(cv2.CAP_PROP_FPS) or 0.0) or 30.0
        by_index = (self._consumed - 1) / fps
        try:
            msec = float(cap.get(cv2.CAP_PROP_POS_MSEC))
        except Exception:  # a backend without positions: the frame's place is its time
            msec = float("nan")
        t = msec / 1000.0 if math.isfinite(msec) and msec >= 0 else by_index
        if self._consumed > 1 and t <= 0.0:
            t = by_index  # no timestamps in this container
        self.frame_time = self._time_offset + t

    def open(self) -> None:
        if not self.path.exists():
            raise SourceError(f"{self.path}: video file not found")
        if not os.access(self.path, os.R_OK):
            raise SourceError(f"{self.path}: video file is not readable (permissions)")
        self._stopping = False
        self._direct = stat.S_ISREG(self.path.stat().st_mode)
        if self._direct:
            opened = self._open_blocking(None)
        else:
            self._calls = _BlockingCalls(f"edgert-read:{self.path.name}")
            status, opened = self._calls.call(self._open_blocking, None, self.timeout)
            if status != "ok":
                self.stalls += status == "timeout"
                self._abandon()
                raise SourceError(f"{self.path}: no frame within {self.timeout:g} s (a FIFO nobody writes to, or "
                                  "a stalled mount?). Note: source.timeout_s sets the wait" if status == "timeout"
                                  else f"{self.path}: stopped while opening")
        cap, frame = opened
        self._cap = cap
        self._first = frame
        self.height, self.width = int(frame.shape[0]), int(frame.shape[1])
        cv2 = _cv2()
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        self.fps = fps if fps > 0 else None
        self._frame_count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self._time_offset = 0.0
        self._first_time = max(0.0, float(cap.get(cv2.CAP_PROP_POS_MSEC) or 0.0) / 1000.0)
        self._opened = True
        log.info("opened video %s: %dx%d at %s fps, %d frames", self.path, self.width, self.height,
                 self.fps, self._frame_count)

    def _open_blocking(self, _: Any) -> tuple[Any, np.ndarray]:
        cv2 = _cv2()
        cap = cv2.VideoCapture(str(self.path))
        if not cap.isOpened():
            cap.release()
            raise SourceError(f"{self.path}: cannot open as a video (unreadable or unsupported format)")
        ok, frame = cap.read()
        if not ok or frame is None:
            cap.release()
            raise SourceError(f"{self.path}: no frame could be decoded (damaged or unsupported video)")
        return cap, frame

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        if self._cap is None:
            return None
        if self._first is not None:
            first, self._first = self._first, None
            self._consumed += 1
            self.frame_time = self._first_time
            return _into(out, first)
        if self._direct:
            if self._stopping:
                self.end_reason = "stopped"
                return None
            frame = self._read_blocking(out)
            if frame is None and self.end_reason is None:
                self.end_reason = "end of input"
            return frame
        calls = self._calls
        if calls is None:
            return None
        status, frame = calls.call(self._read_blocking, out, self.timeout)
        if status == "ok":
            if frame is None and self.end_reason is None:
                self.end_reason = "end of input"
            return frame  # type: ignore[no-any-return]
        if status == "timeout":
            self.stalls += 1
            self.end_reason = f"stalled: no frame for {self.timeout:g} s"
            log.warning("%s: no frame for %g s: the source has stalled, ending it", self.path, self.timeout)
        else:
            self.end_reason = "stopped"
        self._abandon()
        return None

    def _read_blocking(self, out: np.ndarray | None) -> np.ndarray | None:
        cv2 = _cv2()
        bad = 0
        while True:
            ok, frame = self._cap.read(out) if out is not None else self._cap.read()
            if ok and frame is not None:
                # Failed reads followed by a good one were damaged frames inside the file: counted skips.
                self.skip(SKIP_UNDECODABLE, bad)
                self._consumed += bad + 1
                self._stamp(self._cap)
                return frame  # type: ignore[no-any-return]
            # OpenCV's position counts decoded frames only; ours also counts the undecodable ones.
            if self._frame_count and self._consumed + bad < self._frame_count - 1 and bad < MAX_CONSECUTIVE_BAD_FRAMES:
                bad += 1
                self._bad_frame(self.path, self._consumed + bad - 1)
                continue
            # Frames the container lists that never came after failed reads: the file's damaged end. A
            # shortfall of a frame or two (1 %) is the frame count's own error (some containers estimate it).
            lost = self._frame_count - self._consumed if bad else 0
            damaged = lost > max(2, self._frame_count // 100)
            if damaged:
                self._bad_frame.count = max(0, self._bad_frame.count - bad)  # read attempts, not frames
                self.skip(SKIP_DAMAGED_END, lost)
                reason = (f"damaged video: no frame decodes after frame {self._consumed} of {self._frame_count} "
                          f"({lost} frames lost)")
                log.warning("%s: %s", self.path, reason)
            if self.loop and self._consumed > 0:
                self._time_offset = (self.frame_time or 0.0) + 1.0 / (self.fps or 30.0)
                self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
                self._consumed = 0
                bad = 0
                log.info("%s: end of video, looping", self.path)
                continue
            if damaged:
                self._finish(reason, early=True)
            else:
                self._finish("end of input", early=False)
            return None

    def _finish(self, reason: str, early: bool) -> None:
        self.end_reason = reason
        self.ended_early = early
        self._bad_frame.summary(f"{self.path}: frames that could not be decoded")
    def _abandon(self) -> None:
        """After a stall or a stop: no more reads. A reader stuck inside OpenCV keeps its capture (releasing
        it under a running read would crash); it is a daemon thread and goes with the process."""
        calls, self._calls = self._calls, None
        if calls is None:
            return
        calls.stop()
        calls.close()
        if calls.busy:
            log.debug("%s: a read is still blocked; its capture is left to the process exit", self.path)
            self._cap = None
        elif self._cap is not None:
            self._cap.release()
            self._cap = None

    def stop(self) -> None:
        self._stopping = True
        calls = self._calls
        if calls is not None:
            calls.stop()

    def close(self) -> None:
        self._bad_frame.summary(f"{self.path}: frames that could not be decoded")
        self._abandon()
        if self._cap is not None:
            self._cap.release()
            self._cap = None
        self._opened = False


class ImageFilesSource(FrameSource):
    """Still images (one file, a folder, or a glob), in name order; unreadable images are counted skips."""

    kind = "images"

    def __init__(self, uri: str, paths: list[Path], loop: bool = False) -> None:
        super().__init__(uri)
        self.paths = paths
        self.loop = loop
        self._next = 0
        self._pending: np.ndarray | None = None
        self.current: Path | None = None  # the file the last frame came from
        self._bad_image = RepeatedWarning(log, "%s: cannot decode image, skipped")

    def open(self) -> None:
        if not self.paths:
            raise SourceError(f"{self.uri}: no images found (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
        # Decode the first readable image now: sinks need the frame size before the first frame.
        self._next = 0
        self._pending = self._decode_next()
        if self._pending is None:
            raise SourceError(f"{self.uri}: none of the {len(self.paths)} images could be decoded")
        self.height, self.width = int(self._pending.shape[0]), int(self._pending.shape[1])
        self._opened = True

    def _decode_next(self) -> np.ndarray | None:
        cv2 = _cv2()
        while self._next < len(self.paths):
            path = self.paths[self._next]
            self._next += 1
            frame = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if frame is None:
                self.skip(SKIP_UNREADABLE_IMAGE)
                self._bad_image(path)
                continue
            self.current = path
            return frame  # type: ignore[no-any-return]
        return None

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            return _into(out, pending)
        frame = self._decode_next()
        if frame is None and self.loop and self.skipped < len(self.paths):
            self._next = 0
            frame = self._decode_next()
        if frame is None:
            self.end_reason = "end of input"
            self._bad_image.summary(f"{self.uri}: images that could not be decoded")
            return None
        return _into(out, frame)

    def close(self) -> None:
        self._bad_image.summary(f"{self.uri}: images that could not be decoded")
        self._opened = False


# --------------------------------------------------------------------------------------------------
# Live sources


class LiveSource(FrameSource):
    """A camera or stream read by a grabber thread that keeps only the newest frame.

    ``opener`` returns an object with OpenCV's ``VideoCapture`` methods (``isOpened``, ``read``,
    ``get``, ``release``). It is called again to reconnect after a failure, waiting ``backoff`` seconds,
    doubled after each failed attempt up to ``max_backoff``. No new frame for ``timeout`` seconds is a
    stall: counted, and the stream is reconnected by a fresh grabber (the stuck one is left to finish
    its call, then it exits without touching anything).
    """

    live = True
    kind = "live"
    time_base = "capture clock"

    def __init__(self, uri: str, opener: Callable[[], Any], backoff: float = 0.5, max_backoff: float = 10.0,
                 first_frame_timeout: float = 15.0, kind: str = "live", timeout: float | None = None) -> None:
        super().__init__(uri)
        self.kind = kind
        self._opener = opener
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._first_timeout = first_frame_timeout
        self.timeout = timeout if timeout is not None else LIVE_TIMEOUT_S
        self._cond = threading.Condition()
        self._latest: np.ndarray | None = None
        self._latest_time: float | None = None
        self._fresh = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._generation = 0  # a grabber publishes only while it is the current one
        self.frames_grabbed = 0

    def _connect(self) -> Any:
        try:
            cap = self._opener()
        except Exception as exc:  # OpenCV raises cv2.error, a plain Exception subclass
            raise SourceError(f"{self.uri}: cannot open: {redact(last_line(exc))}") from exc
        if cap is None or not cap.isOpened():
            if cap is not None:
                cap.release()
            raise SourceError(f"{self.uri}: cannot open (device busy or absent, or stream unreachable)")
        return cap

    def open(self) -> None:
        cv2 = _cv2()
        cap = self._connect_at_start()
        ok, frame = cap.read()
        deadline = time.monotonic() + self._first_timeout
        while (not ok or frame is None) and time.monotonic() < deadline:
            time.sleep(0.05)
            ok, frame = cap.read()
        if not ok or frame is None:
            cap.release()
            raise SourceError(f"{self.uri}: opened but delivered no frame within {self._first_timeout:g} s")
        self.height, self.width = int(frame.shape[0]), int(frame.shape[1])
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        self.fps = fps if 0 < fps < 1000 else None
        self._latest = frame
        self._latest_time = time.time()
        self._fresh = True
        self._stopping.clear()
        self._start_grabber(cap, np.empty_like(frame))
        self._opened = True
        log.info("opened %s: %dx%d at %s fps", self.uri, self.width, self.height, self.fps)

    def _connect_at_start(self) -> Any:
        """Connect, retrying a camera or stream that is not up yet with the backoff used after a loss, for at
        most ``timeout`` seconds (a camera that boots slower than the Jetson); then the last error."""
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while True:
            try:
                return self._connect()
            except SourceError as exc:
                delay = min(self._max_backoff, self._backoff * (2 ** attempt))
                attempt += 1
                if self._stopping.is_set() or time.monotonic() + delay > deadline:
                    if attempt == 1:
                        raise
                    raise SourceError(f"{exc} ({attempt} attempts in {self.timeout:g} s)") from None
                log.warning("%s; retrying in %.1f s (attempt %d)", exc, delay, attempt)
                if self._stopping.wait(delay):
                    raise SourceError(f"{self.uri}: stopped before it could be opened") from None

    def _start_grabber(self, cap: Any, spare: np.ndarray | None) -> None:
        with self._cond:
            self._generation += 1
            generation = self._generation
        self._thread = threading.Thread(target=self._grab_loop, args=(generation, cap, spare),
                                        name=f"edgert-grab:{self.uri}", daemon=True)
        self._thread.start()

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self._stopping.is_set()

    def _grab_loop(self, generation: int, cap: Any, spare: np.ndarray | None) -> None:
        # Everything this grabber reads into is its own (cap, spare) until published under the lock, so a
        # grabber abandoned after a stall can finish its stuck call without disturbing its successor.
        attempt = 0
        try:
            while self._current(generation):
                if cap is None:
                    delay = min(self._max_backoff, self._backoff * (2 ** attempt))
                    attempt += 1
                    log.warning("%s: reconnecting in %.1f s (attempt %d)", self.uri, delay, attempt)
                    if self._stopping.wait(delay) or not self._current(generation):
                        break
                    try:
                        cap = self._connect()
                    except SourceError as exc:
                        log.warning("%s", exc)
                        continue
                    if not self._current(generation):
                        break
                    self.reconnects += 1
                    log.warning("%s: reconnected", self.uri)
                    attempt = 0
                try:
                    ok, frame = cap.read(spare) if spare is not None else cap.read()
                except Exception as exc:  # a driver error mid-stream: treat like a lost stream
                    log.warning("%s: read failed: %s", self.uri, last_line(exc))
                    ok, frame = False, None
                if not ok or frame is None:
                    if self._current(generation):
                        log.warning("%s: stream stopped delivering frames", self.uri)
                    cap.release()
                    cap = None
                    continue
                with self._cond:
                    if generation != self._generation:
                        break  # abandoned while reading: the frame is not ours to publish
                    if self._fresh:
                        self.dropped += 1  # the pipeline never took the previous frame: it is stale now
                    # Swap buffers: the grabber writes the next frame into the one just released.
                    latest = self._latest
                    spare = latest if latest is not None and latest.shape == frame.shape else None
                    self._latest = frame
                    self._latest_time = time.time()  # the capture clock: when the frame arrived
                    self._fresh = True
                    self.frames_grabbed += 1
                    self._cond.notify_all()
        finally:
            if cap is not None:
                cap.release()

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        with self._cond:
            deadline = time.monotonic() + self.timeout
            while not self._fresh:
                if self._stopping.is_set() or self._thread is None:
                    self.end_reason = "stopped"
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.stalls += 1
                    log.warning("%s: no frame for %g s: the stream has stalled, reconnecting", self.uri, self.timeout)
                    self._start_grabber(None, None)  # the stuck one is abandoned, not joined (an RLock: re-entered)
                    deadline = time.monotonic() + self.timeout
                    continue
                self._cond.wait(min(remaining, 1.0))
            if self._stopping.is_set():
                self.end_reason = "stopped"
                return None
            frame = self._latest
            self._fresh = False
            if frame is None:
                return None
            self.frame_time = self._latest_time
            # Copy under the lock: the grabber may reuse this buffer as soon as we let go.
            if out is not None and out.shape == frame.shape and out.dtype == frame.dtype:
                np.copyto(out, frame)
                return out
            return frame.copy()

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout=5.0)  # a grabber stuck in a driver call is a daemon: left to exit
            self._thread = None
        self._opened = False


# --------------------------------------------------------------------------------------------------
# Choosing a source from a URI


def _image_paths(pattern: str) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(pattern) if Path(p).suffix.lower() in IMAGE_SUFFIXES)


def _v4l2_opener(device: str, config: SourceConfig) -> Callable[[], Any]:
    def opener() -> Any:
        cv2 = _cv2()
        cap = cv2.VideoCapture(device, cv2.CAP_V4L2)
        if cap.isOpened():
            # FOURCC first: many UVC cameras offer large sizes only as MJPG.
            if config.fourcc:
                cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*config.fourcc))
            if config.width:
                cap.set(cv2.CAP_PROP_FRAME_WIDTH, config.width)
            if config.height:
                cap.set(cv2.CAP_PROP_FRAME_HEIGHT, config.height)
            if config.fps:
                cap.set(cv2.CAP_PROP_FPS, config.fps)
            cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)  # the driver's queue adds latency; we keep the newest anyway
        return cap

    return opener


def _gst_opener(pipeline: str) -> Callable[[], Any]:
    def opener() -> Any:
        cv2 = _cv2()
        return cv2.VideoCapture(pipeline, cv2.CAP_GSTREAMER)

    return opener


def _ffmpeg_opener(uri: str) -> Callable[[], Any]:
    def opener() -> Any:
        cv2 = _cv2()
        # RTSP over TCP: UDP loses packets on busy networks and FFmpeg then hands out smeared frames.
        os.environ.setdefault("OPENCV_FFMPEG_CAPTURE_OPTIONS", "rtsp_transport;tcp")
        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 10000, cv2.CAP_PROP_READ_TIMEOUT_MSEC, 10000]
        return cv2.VideoCapture(uri, cv2.CAP_FFMPEG, params)

    return opener


def _need_gstreamer(uri: str) -> None:
    if not gstreamer_available():
        raise SourceError(
            f"{uri}: needs OpenCV built with GStreamer (this one is not). "
            "Note: on a Jetson use JetPack's python3-opencv in a venv made with --system-site-packages"
        )


def _csi(uri: str, config: SourceConfig) -> FrameSource:
    sensor = uri[len("csi://"):] or "0"
    if not sensor.isdigit():
        raise SourceError(f"{uri}: expected csi://N with N the sensor id")
    _need_gstreamer(uri)
    width, height, fps = config.width or 1280, config.height or 720, config.fps or 30.0
    pipeline = csi_pipeline(int(sensor), width, height, fps, config.sensor_mode, config.flip)
    return LiveSource(uri, _gst_opener(pipeline), kind="csi", timeout=config.timeout_s)


def _gstreamer(uri: str, config: SourceConfig) -> FrameSource:
    pipeline = uri[len("gst://"):].strip()
    last = pipeline.rsplit("!", 1)[-1].strip()
    if not last.startswith("appsink"):
        raise SourceError(f"{uri}: a gst:// pipeline must end in appsink (e.g. '... ! videoconvert ! appsink')")
    _need_gstreamer(uri)
    return LiveSource(uri, _gst_opener(pipeline), kind="gstreamer", timeout=config.timeout_s)


def _rtsp(uri: str, config: SourceConfig) -> FrameSource:
    if gstreamer_available():
        from edgert.platform import jetson_info

        codec = "h265" if (config.fourcc or "").upper() in ("H265", "HEVC") else "h264"
        jetson = bool(jetson_info().get("is_jetson"))
        return LiveSource(uri, _gst_opener(rtsp_pipeline(uri, jetson=jetson, codec=codec)), kind="rtsp",
                          timeout=config.timeout_s)
    return LiveSource(uri, _ffmpeg_opener(uri), kind="rtsp", timeout=config.timeout_s)


def _stream(uri: str, config: SourceConfig) -> FrameSource:
    return LiveSource(uri, _ffmpeg_opener(uri), kind="stream", timeout=config.timeout_s)


def _is_camera(uri: str) -> bool:
    return uri.startswith("v4l2://") or uri.isdigit() or re.fullmatch(r"/dev/video\d+", uri) is not None


def _v4l2(uri: str, config: SourceConfig) -> FrameSource:
    if uri.startswith("v4l2://"):
        return _camera(uri, uri[len("v4l2://"):], config)
    return _camera(uri, f"/dev/video{uri}" if uri.isdigit() else uri, config)


def _is_images(uri: str) -> bool:
    path_text = file_path_text(uri)
    if any(ch in path_text for ch in "*?["):
        return True
    path = Path(path_text).expanduser()
    return path.is_dir() or path.suffix.lower() in IMAGE_SUFFIXES


def _images(uri: str, config: SourceConfig) -> FrameSource:
    path_text = file_path_text(uri)
    if any(ch in path_text for ch in "*?["):
        paths = _image_paths(path_text)
        if not paths:
            raise SourceError(f"{uri}: no image files match this pattern")
        return ImageFilesSource(uri, paths, config.loop)
    path = Path(path_text).expanduser()
    if path.is_dir():
        paths = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise SourceError(f"{path}: folder has no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        return ImageFilesSource(uri, paths, config.loop)
    if not path.exists():
        raise SourceError(f"{path}: image file not found")
    return ImageFilesSource(uri, [path], config.loop)


def _video(uri: str, config: SourceConfig) -> FrameSource:
    return VideoFileSource(uri, Path(file_path_text(uri)).expanduser(), config.loop, timeout=config.timeout_s)


@dataclass(frozen=True)
class SourceKind:
    """One kind of source: ``accepts(uri)`` says whether a (stripped) URI is of this kind, ``make(uri, config)``
    builds the source (not opened), ``example`` is how a user writes it.

    The facts other rooms ask about (the service unit, docs) without parsing a URI themselves: ``needs(uri)``
    what the source needs from the machine (:data:`~edgert.vision.uri.ARGUS`,
    :data:`~edgert.vision.uri.NETWORK`), ``reads(uri)`` the local path it reads, if any."""

    name: str
    example: str
    accepts: Callable[[str], bool]
    make: Callable[[str, SourceConfig], FrameSource]
    needs: Callable[[str], tuple[str, ...]] = no_needs
    reads: Callable[[str], str | None] = nothing


_NETWORK_ELEMENTS = ("rtspsrc", "souphttpsrc", "udpsrc", "tcpclientsrc")


def _gst_needs(uri: str) -> tuple[str, ...]:
    """What a hand-written GStreamer pipeline needs, read from the elements it names."""
    text = uri.lower()
    needs = (ARGUS,) if "nvarguscamerasrc" in text else ()
    return needs + ((NETWORK,) if any(e in text for e in _NETWORK_ELEMENTS) else ())


#: Every source kind, in the order URIs are matched: schemes first, then cameras, images, and last a video
#: file (which takes any other path). To add a source: a :class:`FrameSource` and one row here (before
#: ``video``, or through :func:`register_source`).
SOURCES: list[SourceKind] = [
    SourceKind("csi", "csi://N", scheme("csi://"), _csi, needs=always(ARGUS)),
    SourceKind("gstreamer", "gst://... ! appsink", scheme("gst://"), _gstreamer, needs=_gst_needs),
    SourceKind("rtsp", "rtsp://...", scheme("rtsp://", "rtsps://"), _rtsp, needs=always(NETWORK)),
    SourceKind("stream", "http://...", scheme("http://", "https://"), _stream, needs=always(NETWORK)),
    SourceKind("v4l2", "/dev/videoN (or N, v4l2://DEVICE)", _is_camera, _v4l2),
    *(SourceKind(*row) for row in AUDIO_ROWS),  # speech tasks' sources (edgert.vision.audio_sources)
    SourceKind("images", "an image, a folder of images, a glob", _is_images, _images, reads=local_file),
    SourceKind("video", "a video file", lambda uri: True, _video, reads=local_file),
]


def register_source(kind: SourceKind, before: str = "video") -> None:
    """Add a source kind (a plugin, a test), tried ahead of the row named ``before``."""
    insert_row(SOURCES, kind, before)


def source_help() -> str:
    """How every source kind is written, for help texts."""
    return ", ".join(row.example for row in SOURCES)


def open_source(source: SourceConfig | str) -> FrameSource:
    """The source for a URI (or a :class:`SourceConfig`), not yet opened: use it in a ``with`` block."""
    config = SourceConfig(uri=source) if isinstance(source, str) else source
    uri = config.uri.strip()
    if not uri:
        raise SourceError("no source given. Note: pass --source URI (a video, image, folder, /dev/videoN, csi://N, "
                          "rtsp://...)")
    row = source_kind(uri)
    if row.name == "video":
        _refuse_unknown_scheme(uri)
    if "://" not in uri or uri.startswith("file://"):
        return row.make(uri, config)
    # A network URI may name its credentials as ${VAR}: only the opener sees them expanded.
    made = row.make(expand_env(uri), config)
    made.uri = redact(uri)
    return made


#: Schemes other tools use that edgert does not read, and what to do instead.
_OTHER_SCHEMES = {
    "rtp": "receive it with gst://udpsrc port=PORT caps=application/x-rtp,... ! rtph264depay ! ... ! appsink",
    "webrtc": "publish the stream as RTSP and read rtsp://...",
}


def _refuse_unknown_scheme(uri: str) -> None:
    """``rtp://@:1234`` is not a file called ``rtp:/@:1234``: a URI of a scheme no source reads is refused."""
    import re

    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):/", uri)
    if match is None or uri.startswith("file://"):
        return
    name = match.group(1).lower()
    hint = _OTHER_SCHEMES.get(name, f"sources are {source_help()}")
    raise SourceError(f"{redact(uri)}: {name}:// sources are not supported. Note: {hint}")


def source_kind(uri: str) -> SourceKind:
    """The row of :data:`SOURCES` a URI is read by (the last row takes any path)."""
    text = uri.strip()
    return next(row for row in SOURCES if row.accepts(text))


def _camera(uri: str, device: str, config: SourceConfig) -> LiveSource:
    if not Path(device).exists():
        raise SourceError(f"{device}: no such camera device. Note: `edgert info` lists the cameras it sees")
    return LiveSource(uri, _v4l2_opener(device, config), kind="v4l2", timeout=config.timeout_s)
