"""What every sink shares: the :class:`Sink` interface, the :class:`FrameResult` it is handed and the
:class:`StreamInfo` it opens with, the :class:`SinkWorker` thread that runs it, and the file helpers
(one locked writer per output file).
"""

from __future__ import annotations

import abc
import contextlib
import errno
import logging
import os
import queue
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Callable

import numpy as np

from edgert.errors import OutputClosed, SinkError, last_line
from edgert.io.uri import file_path_text
from edgert.output_lock import lock_output
from edgert.redact import redact
from edgert.stats import PipelineStats
from edgert.vision.detections import Detections

__all__ = [
    "FrameResult",
    "Sink",
    "SinkWorker",
    "StreamInfo",
    "event_records",
    "frame_record",
    "local_path",
    "release_sinks",
    "result_records",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamInfo:
    """What a sink learns at open: the frame size and rate of the source, and the class names.

    ``sources``: the names of the sources whose frames it will get, in order (a shared sink of a run with
    several sources gets them all; empty when the sink is used on its own)."""

    width: int
    height: int
    fps: float | None = None
    names: tuple[str, ...] = ()
    title: str = "edgert"
    stats: PipelineStats | None = field(default=None, compare=False)
    sources: tuple[str, ...] = ()


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
    frame_record: bool = True  # False: the frame is no record of its own (an audio chunk); sinks write its events


def frame_record(result: FrameResult) -> dict[str, Any]:
    """The JSON record of one frame, as the JSONL and MQTT sinks write it."""
    record: dict[str, Any] = {"frame": result.index, "timestamp": round(result.timestamp, 6)}
    if result.source is not None:
        record["source"] = result.source
    if result.file is not None:
        record["file"] = result.file
    record["detections"] = result.detections.to_records()
    return record


def result_records(result: FrameResult) -> list[dict[str, Any]]:
    """What the JSONL and MQTT sinks write for one frame: its record (unless it has none), then its events."""
    head = [frame_record(result)] if result.frame_record else []
    return [*head, *event_records(result)]


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
    #: True: one sink takes the drawn frames of several sources and tells them apart by ``result.source``
    #: (the web preview's tiles). False: a drawing sink shared by several sources is refused (one video file
    #: cannot hold two cameras' frames); give it a ``{source}`` placeholder instead.
    multi_source: bool = False
    #: True (the web preview, a display window): frames skipped while a viewer is slow are by design, not a
    #: loss; the run reports them as ``skipped``, apart from the pipeline's ``dropped``.
    skips_frames: bool = False
    #: What the run's summary says about the output (a video's codec, a fallback), under ``sink_notes``; None: nothing.
    note: str | None = None

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
        """Release what :meth:`prepare` and :meth:`open` took (files, sockets, windows)."""

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def claim_file(path: Path, what: str, append: bool = False) -> tuple[int, bool]:
    """Open ``path`` for writing without truncating it, locked; (fd, whether this call created it). ``append``:
    every write goes to the file's end (``O_APPEND``), wherever another process truncated it to."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = os.path.lexists(path)
        # O_NONBLOCK: a FIFO with no reader fails at once (ENXIO) instead of blocking the open past a stop
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_APPEND if append else 0)
        fd = os.open(path, flags, 0o644)
        os.set_blocking(fd, True)  # the writes wait for the disk (or the FIFO's reader) as before
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise SinkError(f"{path}: a FIFO nothing reads from. Note: start its reader first") from None
        raise SinkError(f"{path}: cannot write {what} here: {exc.strerror or exc}") from None
    try:
        lock_output(fd, path)
    except BaseException:
        os.close(fd)
        if not existed:
            unlink_quietly(path)
        raise
    return fd, not existed


def unlink_quietly(path: Path) -> None:
    """Remove ``path`` if it is there; a file that is already gone is what was wanted."""
    with contextlib.suppress(OSError):
        path.unlink()


def is_deleted(fd: int) -> bool:
    """Whether the regular file open at ``fd`` was deleted (its folder removed, ``rm``): writes would vanish."""
    try:
        st = os.fstat(fd)
    except OSError:
        return True
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 0


def check_writable(path: Path, what: str = "the video") -> None:
    """Fail at open, in one line, when ``path`` cannot be created (OpenCV would only return False)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with open(path, "ab"):
            pass  # opening for append creates it (or proves it writable) without touching its bytes
        if not existed:
            path.unlink()
    except OSError as exc:
        raise SinkError(f"{path}: cannot write {what} here: {exc.strerror or exc}") from None


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
                             result.events, result.frame_record)
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
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else last_line(exc)
            error = SinkError(f"{self.sink.uri}: writing failed: {detail}")
        self._lost_queued += 1  # the frame being written
        self.error = error
        # info, not error: the pipeline stops on it and the CLI prints it once, as its one-line error
        log.info("sink %s failed and stops: %s", redact(self.sink.uri), error)
        try:
            self.sink.close()  # finalise now: the run may still be killed before it closes its sinks
        except Exception as close_exc:
            log.warning("sink %s did not close cleanly after failing: %s", redact(self.sink.uri), close_exc)
        if self.on_failure is not None:
            try:
                self.on_failure(self)
            except Exception:
                log.warning("on_failure of sink %s raised", redact(self.sink.uri), exc_info=True)

    def drop_queued(self) -> int:
        """Drop the frames waiting in the queue (a stop past its deadline), counted in ``dropped``; how many."""
        dropped = 0
        while True:
            try:
                result = self._queue.get_nowait()
            except queue.Empty:
                break
            if result is None:  # the end marker of a close already under way: it stays, last
                self._queue.put_nowait(None)
                break
            dropped += 1
            if result.image is not None:
                self._free.put(result.image)
        self._dropped += dropped
        return dropped

    def close(self, timeout: float = 10.0) -> None:
        """Let the sink finish what is queued, then close it."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("sink %s did not finish within %.0f s", redact(self.sink.uri), timeout)
            self._thread = None
        self.sink.close()


def release_sinks(sinks: Sequence[Sink]) -> None:
    """Close sinks that a failed start leaves behind; one that fails to close is logged, not raised, so the
    start's own error is the one the user sees."""
    for sink in sinks:
        try:
            sink.close()
        except Exception as exc:
            log.warning("sink %s did not release cleanly: %s", redact(sink.uri), exc)


def local_path(uri: str) -> tuple[str, Path]:
    """A file or folder sink's URI (``file://`` optional, ``?options`` kept) and the path it names."""
    path_text = file_path_text(uri)
    return path_text, Path(path_text.partition("?")[0]).expanduser()
