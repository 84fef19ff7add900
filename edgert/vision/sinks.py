"""Where detections go, chosen by URI: JSON Lines, a video file, a window, a web preview, RTSP.

``open_sink(uri)`` returns a :class:`Sink` (not opened). Opening has two steps so that a run that cannot
start destroys nothing: ``prepare()`` checks and claims everything (the folder exists and is writable, the
output file is locked against a second run, the port is bound) without touching an existing output, and
``open(info)`` then truncates and starts writing. :func:`prepare_sinks` prepares every sink of a run (and
releases them all when one fails); only then does the pipeline open them (:func:`open_sinks`).

A sink that fails mid-run (a full disk, a closed pipe, a deleted folder) is an error, not a log line: its
:class:`SinkWorker` records it (``failed``, ``error``, ``lost``), finalises the sink at once (a JSONL file
ends on its last whole line, a video is released) and takes no more frames.

The pipeline never calls a sink directly: each sink runs on its own thread behind a :class:`SinkWorker`,
which hands it frames through a bounded queue of preallocated image buffers. When the sink is slower
than the pipeline the queue is full, the frame is dropped for that sink and counted;
the pipeline never waits for a sink.

URIs: ``jsonl://events.jsonl``, ``jsonl://-`` (stdout), ``out.mp4`` / ``out.avi`` (annotated video),
``out.jpg`` (the last annotated frame, replaced atomically), ``frames/`` (one annotated image per frame;
``frames/?every=10`` every tenth), ``display://0`` (an OpenCV window), ``http://127.0.0.1:8080`` (web
preview: MJPEG stream + live stats; give another host such as 0.0.0.0 to serve beyond this machine),
``rtsp://server:8554/edgert`` (publish through GStreamer's rtspclientsink to an RTSP server such as mediamtx),
``mqtt://broker:1883/topic`` and ``mqtts://`` (publish JSON to an MQTT broker: :mod:`edgert.vision.sink_mqtt`).

From Python, :class:`CallbackSink` hands every frame's :class:`FrameResult` to a function, on the sink's
own thread: ``Pipeline(config, sinks=[CallbackSink(on_frame)]).run()``.
"""

from __future__ import annotations

import abc
import errno
import json
import logging
import os
import queue
import stat
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Callable
from urllib.parse import parse_qs

import numpy as np

from edgert._lazy import lazy_import
from edgert.errors import OutputClosed, SinkError
from edgert.output_lock import lock_output
from edgert.pipeline.stats import PipelineStats
from edgert.vision.detections import Detections

__all__ = [
    "VIDEO_SUFFIXES",
    "CallbackSink",
    "DisplaySink",
    "FrameResult",
    "ImageFileSink",
    "ImageFolderSink",
    "JsonlSink",
    "OutputClosed",
    "RtspSink",
    "Sink",
    "SinkWorker",
    "StreamInfo",
    "VideoFileSink",
    "as_sink",
    "event_records",
    "frame_record",
    "lock_output",
    "open_sink",
    "open_sinks",
    "prepare_sinks",
    "rtsp_out_pipeline",
]

log = logging.getLogger(__name__)

#: Free space a video sink keeps so that it can still be finalised: what OpenCV's FFmpeg writer holds
#: before it writes (it was seen flushing in 256 KiB steps) and the container trailer, plus per frame
#: written its index entry (MP4 stsz/stco, AVI idx1: 16 bytes and less).
VIDEO_RESERVE_BYTES = 512 * 1024
INDEX_BYTES_PER_FRAME = 32

#: Containers and the FourCC that OpenCV's pip wheel (FFmpeg inside) can write for each.
VIDEO_SUFFIXES: dict[str, str] = {".mp4": "mp4v", ".m4v": "mp4v", ".mov": "mp4v", ".mkv": "mp4v", ".avi": "MJPG"}


@dataclass(frozen=True)
class StreamInfo:
    """What a sink learns at open: the frame size and rate of the source, and the class names."""

    width: int
    height: int
    fps: float | None = None
    names: tuple[str, ...] = ()
    title: str = "edgert"
    stats: PipelineStats | None = field(default=None, compare=False)


@dataclass
class FrameResult:
    """One processed frame as sinks see it. ``image`` is annotated when a sink needs pixels."""

    index: int
    timestamp: float  # wall-clock seconds (time.time()) when the frame was captured
    detections: Detections
    image: np.ndarray | None = None
    file: str | None = None  # the image file, for folder sources
    source: str | None = None  # the source's name (or index) in a pipeline with several
    events: list[dict[str, Any]] = field(default_factory=list)  # analytics events of this frame (line_cross, ...)


def frame_record(result: FrameResult) -> dict[str, Any]:
    """The JSON record of one frame, as the JSONL and MQTT sinks write it."""
    record: dict[str, Any] = {"frame": result.index, "timestamp": round(result.timestamp, 6)}
    if result.source is not None:
        record["source"] = result.source
    if result.file is not None:
        record["file"] = result.file
    record["detections"] = result.detections.to_records()
    return record


def event_records(result: FrameResult) -> list[dict[str, Any]]:
    """The frame's analytics events, each its own record with a ``type`` (``line_cross``, ``zone_enter``...)."""
    return [dict(event) for event in result.events]


class Sink(abc.ABC):
    """One output. ``prepare`` and ``open`` raise :class:`SinkError` (one line) when it cannot work at all.

    ``prepare()`` must not change an existing output; ``open(info)`` calls it when it was not called;
    ``close()`` is safe at any point (after prepare only, it releases what prepare claimed) and twice.
    """

    #: Whether ``write`` uses ``result.image`` (the pipeline draws the boxes once for all such sinks).
    needs_image: bool = False
    #: Frames that may wait for this sink before new ones are dropped.
    queue_size: int = 1
    #: True: the sink must see every frame (files): a full queue makes the pipeline wait instead of dropping.
    #: False (previews, displays, streams): a slow sink skips frames, counted, and never slows the pipeline.
    lossless: bool = False

    def __init__(self, uri: str) -> None:
        self.uri = uri
        #: Messages the sink itself had to drop (a full outgoing queue); the worker adds them to its own count.
        self.dropped = 0

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Check and claim what ``open`` needs (folder, lock, port) without touching an existing output."""

    @abc.abstractmethod
    def open(self, info: StreamInfo) -> None: ...

    @abc.abstractmethod
    def write(self, result: FrameResult) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# One writer per output file


def _claim_file(path: Path, what: str) -> tuple[int, bool]:
    """Open ``path`` for writing without truncating it, locked; (fd, whether this call created it)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = os.path.lexists(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise SinkError(f"{path}: cannot write {what} here: {exc.strerror or exc}") from None
    try:
        lock_output(fd, path)
    except BaseException:
        os.close(fd)
        if not existed:
            _unlink_quietly(path)
        raise
    return fd, not existed


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _deleted(fd: int) -> bool:
    """Whether the regular file open at ``fd`` was deleted (its folder removed, ``rm``): writes would vanish."""
    try:
        st = os.fstat(fd)
    except OSError:
        return True
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 0


# --------------------------------------------------------------------------------------------------
# JSON Lines


class JsonlSink(Sink):
    """One JSON object per frame: ``{"frame", "timestamp", "detections": [...]}``, then one per analytics
    event of that frame: ``{"type": "line_cross", "line", "track_id", "class", "direction", "time", "frame"}``.

    Each line goes out in one ``write`` call and is flushed at once, so a process killed at any moment
    leaves only whole lines; the file is fsynced at close. When a write fails (a full disk), the file is
    cut back to its last whole line and the sink fails; a file deleted mid-run fails it too.
    """

    queue_size = 1024  # events are small and cheap: a deep queue rides out a slow disk
    lossless = True

    def __init__(self, uri: str, path: str) -> None:
        super().__init__(uri)
        self.path = path
        self._fd: int | None = None
        self._stdout = path == "-"
        self._created = False  # prepare() made the file: a run that never opens it removes it again
        self._opened = False
        self._regular = False
        self._good = 0  # bytes of whole lines in the file
        self.lines = 0

    def prepare(self) -> None:
        if self._stdout or self._fd is not None:
            return
        self._fd, self._created = _claim_file(Path(self.path), "events")
        self._regular = stat.S_ISREG(os.fstat(self._fd).st_mode)

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        if self._fd is not None and self._regular:
            os.ftruncate(self._fd, 0)
            os.lseek(self._fd, 0, os.SEEK_SET)
        self._good = 0
        self._opened = True

    def write(self, result: FrameResult) -> None:
        records = [frame_record(result), *event_records(result)]
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        if self._stdout:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except BrokenPipeError:
                raise OutputClosed("jsonl://-: stdout was closed by its reader") from None
        elif self._fd is not None:
            view = memoryview(data)
            try:
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
            except OSError as exc:
                self._cut_to_last_line()
                raise SinkError(f"{self.path}: writing events failed: {exc.strerror or exc}") from None
            self._good += len(data)
            if self._regular and _deleted(self._fd):
                raise SinkError(f"{self.path}: the file was deleted while the run wrote it")
        self.lines += 1

    def _cut_to_last_line(self) -> None:
        """After a failed write: the file ends on its last whole line again (a cut object is no event)."""
        if self._fd is None or not self._regular:
            return
        try:
            os.ftruncate(self._fd, self._good)
            os.lseek(self._fd, self._good, os.SEEK_SET)
        except OSError as exc:
            log.error("%s: cannot cut the file back to its last whole line: %s", self.path, exc.strerror)

    def close(self) -> None:
        if self._fd is not None:
            if self._opened:
                try:
                    os.fsync(self._fd)
                except OSError:  # a pipe or a special file cannot be synced; a full disk already failed
                    pass
            os.close(self._fd)  # releases the lock
            self._fd = None
            if self._created and not self._opened:  # prepared for a run that never started
                _unlink_quietly(Path(self.path))


# --------------------------------------------------------------------------------------------------
# Video file


def _check_writable(path: Path, what: str = "the video") -> None:
    """Fail at open, in one line, when ``path`` cannot be created (OpenCV would only return False)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with open(path, "ab"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise SinkError(f"{path}: cannot write {what} here: {exc.strerror or exc}") from None


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
        self._fd, self._created = _claim_file(self.path, "the video")
        probe = self.path.with_name(f".{self.path.stem}.edgert-probe-{os.getpid()}{self.path.suffix}")
        try:
            writer = cv2.VideoWriter(str(probe), cv2.VideoWriter_fourcc(*self.fourcc), 10.0, (64, 64))
            ok = writer.isOpened()
            writer.release()
        finally:
            _unlink_quietly(probe)
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
        if _deleted(self._fd):
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
                _unlink_quietly(self.path)


# --------------------------------------------------------------------------------------------------
# Display window


class DisplaySink(Sink):
    """An OpenCV window (needs an OpenCV with a GUI and a display; the pip 'headless' wheel has none)."""

    needs_image = True

    def __init__(self, uri: str, title: str = "edgert") -> None:
        super().__init__(uri)
        self.title = title
        self._open = False

    def prepare(self) -> None:
        lazy_import("cv2", "the display window")
        if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            raise SinkError(f"{self.uri}: no display here (DISPLAY is not set). Note: use http://127.0.0.1:8080")

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        cv2 = lazy_import("cv2", "the display window")
        try:
            cv2.namedWindow(self.title, cv2.WINDOW_NORMAL)
        except cv2.error:
            raise SinkError(
                f"{self.uri}: this OpenCV has no GUI support (headless build). "
                "Note: use the web preview http://127.0.0.1:8080 or install opencv-python"
            ) from None
        self._open = True

    def write(self, result: FrameResult) -> None:
        if self._open and result.image is not None:
            cv2 = lazy_import("cv2")
            cv2.imshow(self.title, result.image)
            cv2.waitKey(1)

    def close(self) -> None:
        if self._open:
            cv2 = lazy_import("cv2")
            cv2.destroyWindow(self.title)
            self._open = False


# --------------------------------------------------------------------------------------------------
# RTSP out


def rtsp_out_pipeline(uri: str, fps: float, jetson: bool = False, bitrate_kbps: int = 4000) -> str:
    """appsrc -> H.264 -> rtspclientsink (publishes to an RTSP server at ``uri``)."""
    if jetson:
        encode = (
            "videoconvert ! video/x-raw, format=(string)BGRx ! nvvidconv ! "
            "video/x-raw(memory:NVMM), format=(string)NV12 ! "
            f"nvv4l2h264enc insert-sps-pps=true bitrate={bitrate_kbps * 1000} ! h264parse"
        )
    else:
        encode = (
            "videoconvert ! video/x-raw, format=(string)I420 ! "
            f"x264enc tune=zerolatency speed-preset=ultrafast bitrate={bitrate_kbps} "
            f"key-int-max={max(1, round(fps))} ! "
            "h264parse"
        )
    return f"appsrc is-live=true ! video/x-raw, format=(string)BGR ! {encode} ! rtspclientsink location={uri}"


class RtspSink(Sink):
    """Annotated frames published over RTSP through GStreamer (JetPack's OpenCV has it)."""

    needs_image = True

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self._writer: Any = None
        self._size = (0, 0)

    def prepare(self) -> None:
        from edgert.vision.sources import gstreamer_available

        lazy_import("cv2", "RTSP output")
        if not gstreamer_available():
            raise SinkError(
                f"{self.uri}: RTSP output needs OpenCV built with GStreamer (this one is not). "
                "Note: use the web preview http://127.0.0.1:8080, or JetPack's python3-opencv"
            )

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        cv2 = lazy_import("cv2", "RTSP output")
        from edgert.platform import jetson_info

        fps = info.fps or 30.0
        pipeline = rtsp_out_pipeline(self.uri, fps, jetson=bool(jetson_info().get("is_jetson")))
        self._size = (info.width, info.height)
        writer = cv2.VideoWriter(pipeline, cv2.CAP_GSTREAMER, 0, fps, self._size, True)
        if not writer.isOpened():
            writer.release()
            raise SinkError(f"{self.uri}: GStreamer could not start the RTSP publisher (is an RTSP server there?)")
        self._writer = writer

    def write(self, result: FrameResult) -> None:
        if self._writer is not None and result.image is not None:
            image = result.image
            if (image.shape[1], image.shape[0]) != self._size:
                image = lazy_import("cv2").resize(image, self._size)
            self._writer.write(image)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None


# --------------------------------------------------------------------------------------------------
# Images: the last frame, or a folder of frames


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
        from edgert.vision.image_io import encode_image

        lazy_import("cv2", "writing images")
        try:
            encode_image(np.zeros((2, 2, 3), np.uint8), self.path.suffix)  # the format is writable
        except Exception as exc:
            raise SinkError(f"{self.path}: {exc}") from None
        _check_writable(self.path, "the image")

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


class ImageFolderSink(Sink):
    """One annotated image per frame (or per ``every`` frames) in a folder: ``frame_000042.jpg``.

    For image sources each file takes its source image's name instead (``bus.jpg`` -> ``bus.jpg``), so a
    folder in gives the same folder annotated. Every file is written whole (temporary name, then rename).
    """

    needs_image = True
    queue_size = 32  # encoding a JPEG takes a few ms: a longer queue rides out bursts before dropping

    def __init__(self, uri: str, folder: Path, every: int = 1, suffix: str = ".jpg") -> None:
        super().__init__(uri)
        self.folder = folder
        self.every = every
        self.suffix = suffix if suffix.startswith(".") else f".{suffix}"
        self.written = 0

    def open(self, info: StreamInfo) -> None:
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

    def name_for(self, result: FrameResult) -> str:
        if result.file:
            return Path(result.file).stem + self.suffix
        return f"frame_{result.index:06d}{self.suffix}"

    def write(self, result: FrameResult) -> None:
        from edgert.vision.image_io import write_image

        if result.image is None or result.index % self.every:
            return
        try:
            write_image(self.folder / self.name_for(result), result.image)
        except Exception as exc:
            raise SinkError(str(exc)) from None
        self.written += 1

    def close(self) -> None:
        if self.written:
            log.info("wrote %d images to %s", self.written, self.folder)


# --------------------------------------------------------------------------------------------------
# A function of the application's


class CallbackSink(Sink):
    """Calls ``fn(result)`` with every frame's :class:`FrameResult`, on this sink's own thread.

    The way to get each frame's detections out of a :class:`~edgert.pipeline.Pipeline` without
    subclassing anything::

        def on_frame(result: FrameResult) -> None:
            print(result.index, result.detections.counts())

        Pipeline(config, sinks=[CallbackSink(on_frame)]).run()

    With ``image=True`` the result carries the annotated frame too (and ``result.detections.plot()`` works
    on the raw boxes). The image buffer is reused once ``fn`` returns: copy it to keep it. A callback slower
    than the pipeline gets frames dropped (counted as ``sink:callback://NAME``), never slows the pipeline;
    an exception in it stops this sink (logged), not the pipeline.
    """

    def __init__(self, fn: Callable[[FrameResult], Any], image: bool = False, queue_size: int = 64,
                 name: str | None = None) -> None:
        super().__init__(f"callback://{name or getattr(fn, '__name__', type(fn).__name__)}")
        self.fn = fn
        self.needs_image = image
        self.queue_size = queue_size
        self.info: StreamInfo | None = None

    def open(self, info: StreamInfo) -> None:
        self.info = info

    def write(self, result: FrameResult) -> None:
        if result.image is not None and result.detections.image is None:
            d = result.detections
            result = FrameResult(result.index, result.timestamp,
                                 Detections(d.xyxy, d.confidence, d.class_id, d.names, d.track_id, result.image),
                                 result.image, result.file)
        self.fn(result)


# --------------------------------------------------------------------------------------------------
# Running a sink without blocking the pipeline


class SinkWorker:
    """Runs one sink on its own thread, fed through a bounded queue; full queue -> drop and count.

    Images are copied into a fixed set of ``queue_size + 1`` buffers made at the first frame, so the
    pipeline may reuse its own frame buffer as soon as ``offer`` returns.

    A sink whose ``write`` raises has failed for good: ``failed`` turns true, ``error`` is a one-line
    :class:`SinkError` (:class:`OutputClosed` when the reader of stdout left), the sink is closed at once
    (finalising its file), and every frame from the one that failed on is counted in ``lost`` (never in
    ``dropped``, which counts frames skipped because the sink was behind). ``on_failure(worker)`` is called
    once, from the worker's thread, so the pipeline can stop and exit non-zero.
    """

    def __init__(self, sink: Sink, on_failure: Callable[[SinkWorker], None] | None = None) -> None:
        self.sink = sink
        self._dropped = 0
        self.on_failure = on_failure
        self.written = 0
        self.error: SinkError | None = None
        self._lost_offered = 0  # counted by the pipeline's thread (offer) ...
        self._lost_queued = 0  # ... and by the worker's thread: two counters, no lock on the hot path
        self._queue: queue.Queue[FrameResult | None] = queue.Queue(maxsize=sink.queue_size)
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._buffers_made = False
        self._thread: threading.Thread | None = None

    @property
    def dropped(self) -> int:
        """Frames this worker dropped (sink behind or failed) plus messages the sink itself dropped."""
        return self._dropped + int(getattr(self.sink, "dropped", 0))

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def lost(self) -> int:
        """Frames this sink did not write because it had failed (the failing one included)."""
        return self._lost_offered + self._lost_queued

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"edgert-sink:{self.sink.uri}", daemon=True)
        self._thread.start()

    def offer(self, result: FrameResult, abort: threading.Event | None = None) -> bool:
        """Hand over one frame; False (and counted) when the sink is behind or has failed.

        A ``lossless`` sink is never behind: the call waits for room (until ``abort`` is set, then the
        frame counts as dropped, or until the sink fails, then it counts as lost).
        """
        if self.error is not None:
            self._lost_offered += 1
            return False
        wait = self.sink.lossless
        image = result.image
        buf: np.ndarray | None = None
        if self.sink.needs_image and image is not None:
            if not self._buffers_made:
                for _ in range(self.sink.queue_size + 1):
                    self._free.put(np.empty_like(image))
                self._buffers_made = True
            buf = self._take(wait, abort)
            if buf is None:
                self._count_refused()
                return False
            if buf.shape != image.shape:
                buf = np.empty_like(image)
            np.copyto(buf, image)
        result = FrameResult(result.index, result.timestamp, result.detections, buf, result.file, result.source,
                             result.events)
        if self._put(result, wait, abort):
            return True
        self._count_refused()
        if buf is not None:
            self._free.put(buf)
        return False

    def _count_refused(self) -> None:
        if self.error is not None:
            self._lost_offered += 1  # it failed while we waited
        else:
            self._dropped += 1

    def _take(self, wait: bool, abort: threading.Event | None) -> np.ndarray | None:
        while True:
            try:
                return self._free.get(timeout=0.1) if wait else self._free.get_nowait()
            except queue.Empty:
                if not wait or self.error is not None or (abort is not None and abort.is_set()):
                    return None

    def _put(self, result: FrameResult, wait: bool, abort: threading.Event | None) -> bool:
        while True:
            try:
                if wait:
                    self._queue.put(result, timeout=0.1)
                else:
                    self._queue.put_nowait(result)
                return True
            except queue.Full:
                if not wait or self.error is not None or (abort is not None and abort.is_set()):
                    return False

    def _loop(self) -> None:
        while True:
            result = self._queue.get()
            if result is None:
                return
            try:
                if self.error is None:
                    self.sink.write(result)
                    self.written += 1
                else:
                    self._lost_queued += 1
            except Exception as exc:
                self._failed(exc)
            finally:
                if result.image is not None:
                    self._free.put(result.image)

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, SinkError):
            error = exc
        elif isinstance(exc, BrokenPipeError):
            error = OutputClosed(f"{self.sink.uri}: the reader closed the output")
        else:
            text = str(exc).strip()
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else (
                text.splitlines()[-1] if text else type(exc).__name__)
            error = SinkError(f"{self.sink.uri}: writing failed: {detail}")
        self._lost_queued += 1  # the frame being written
        self.error = error
        # info, not error: the pipeline stops on it and the CLI prints it once, as its one-line error
        log.info("sink %s failed and stops: %s", self.sink.uri, error)
        try:
            self.sink.close()  # finalise now: the run may still be killed before it closes its sinks
        except Exception as close_exc:
            log.warning("sink %s did not close cleanly after failing: %s", self.sink.uri, close_exc)
        if self.on_failure is not None:
            try:
                self.on_failure(self)
            except Exception:
                log.warning("on_failure of sink %s raised", self.sink.uri, exc_info=True)

    def close(self, timeout: float = 10.0) -> None:
        """Let the sink finish what is queued, then close it."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("sink %s did not finish within %.0f s", self.sink.uri, timeout)
            self._thread = None
        self.sink.close()


# --------------------------------------------------------------------------------------------------
# Preparing and opening the sinks of a run


def prepare_sinks(specs: Sequence[str | Sink], title: str = "edgert") -> list[Sink]:
    """Every sink of a run, prepared (checked, locked, bound) and not yet opened; nothing is truncated.

    Call it before opening any sink: when one cannot work, the ones already prepared are released
    (files they created removed, ports closed) and its one-line :class:`SinkError` is raised, so a run
    that does not start leaves every existing output as it was.
    """
    sinks: list[Sink] = []
    try:
        for spec in specs:
            sink = open_sink(spec, title) if isinstance(spec, str) else spec
            sinks.append(sink)
            sink.prepare()
    except BaseException:
        for sink in reversed(sinks):
            try:
                sink.close()
            except Exception as exc:
                log.warning("sink %s did not release cleanly: %s", sink.uri, exc)
        raise
    return sinks


def open_sinks(sinks: Sequence[Sink], info: StreamInfo,
               on_failure: Callable[[SinkWorker], None] | None = None) -> list[SinkWorker]:
    """Open prepared sinks and start a :class:`SinkWorker` for each; on a failure close them all and raise."""
    workers: list[SinkWorker] = []
    try:
        for sink in sinks:
            sink.open(info)
            worker = SinkWorker(sink, on_failure)
            worker.start()
            workers.append(worker)
    except BaseException:
        for worker in workers:
            worker.close()
        for sink in sinks[len(workers):]:
            try:
                sink.close()
            except Exception as exc:
                log.warning("sink %s did not release cleanly: %s", sink.uri, exc)
        raise
    return workers


# --------------------------------------------------------------------------------------------------
# Choosing a sink from a URI


def open_sink(uri: str, title: str = "edgert") -> Sink:
    """The sink for ``uri``, not yet opened."""
    text = uri.strip()
    if text.startswith("jsonl://"):
        path = text[len("jsonl://"):]
        if not path:
            raise SinkError(f"{uri}: expected jsonl://PATH or jsonl://- for stdout")
        return JsonlSink(text, path)
    if text.startswith("display://"):
        return DisplaySink(text, title)
    if text.startswith(("http://", "https://")):
        from edgert.vision.web.server import WebPreviewSink

        return WebPreviewSink.from_uri(text, title)
    if text.startswith("rtsp://"):
        return RtspSink(text)
    if text.startswith(("mqtt://", "mqtts://")):
        from edgert.vision.sink_mqtt import MqttSink

        return MqttSink.from_uri(text)
    from edgert.vision.image_io import IMAGE_WRITE_SUFFIXES

    path_text = text[len("file://"):] if text.startswith("file://") else text
    bare = path_text.partition("?")[0]
    target = Path(bare).expanduser()
    if bare.endswith(("/", os.sep)) or (target.is_dir() and not target.suffix):
        folder, options = _query(uri, path_text, ("every", "format"))
        every = _number(uri, "every", options["every"], int) if "every" in options else 1
        return ImageFolderSink(text, Path(folder).expanduser(), every, options.get("format", "jpg"))
    if target.suffix.lower() in IMAGE_WRITE_SUFFIXES:
        file, options = _query(uri, path_text, ("interval",))
        interval = _number(uri, "interval", options["interval"], float, zero_ok=True) if "interval" in options else 1.0
        return ImageFileSink(text, Path(file).expanduser(), interval)
    if target.suffix.lower() in VIDEO_SUFFIXES:
        return VideoFileSink(text, target)
    valid = ("jsonl://PATH, jsonl://-, out.mp4 (or .avi/.mkv/.mov), out.jpg (or .png), a folder ending in / "
             "(?every=N), display://0, http://127.0.0.1:8080, rtsp://..., mqtt://HOST:PORT/TOPIC, mqtts://...")
    raise SinkError(f"{uri}: unknown sink. Note: valid sinks are {valid}")


def as_sink(spec: str | Sink | Callable[[FrameResult], Any], title: str = "edgert") -> Sink:
    """A sink from what a user may pass in ``sinks=[...]``: a URI, a :class:`Sink`, or a function of a result."""
    if isinstance(spec, str):
        return open_sink(spec, title)
    if isinstance(spec, Sink):
        return spec
    if callable(spec):
        return CallbackSink(spec)
    raise SinkError(f"{spec!r}: not a sink. Note: give a URI, a Sink, or a function taking a FrameResult")
