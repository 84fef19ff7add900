"""File sources: a video file (read on the caller's thread, or a reader thread for a FIFO that may stall)
and still images (one file, a folder, a glob); undecodable frames are counted skips."""

from __future__ import annotations

import glob
import math
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgert.errors import SourceError
from edgert.image_file import ImageSkipped, ImageTooLarge, decode_image_file, max_pixels
from edgert.io.sources.base import (
    FILE_TIMEOUT_S,
    IMAGE_SUFFIXES,
    SKIP_DAMAGED_END,
    SKIP_LARGE_IMAGE,
    SKIP_UNDECODABLE,
    SKIP_UNREADABLE_IMAGE,
    FrameSource,
    RepeatedWarning,
    _cv2,
    _into,
    log,
)

#: Consecutive failed reads after which a video file is considered unreadable from there on.
MAX_CONSECUTIVE_BAD_FRAMES = 25


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


def open_capture(target: str, cannot_open: str, no_frame: str, api: int | None = None) -> tuple[Any, np.ndarray]:
    """An OpenCV capture of ``target`` (a file; with ``api`` ``cv2.CAP_GSTREAMER``, a GStreamer pipeline) and its
    first frame; released again, and ``cannot_open`` or ``no_frame`` raised as the one-line :class:`SourceError`,
    when it does not open or gives no frame."""
    cv2 = _cv2()
    cap = cv2.VideoCapture(target) if api is None else cv2.VideoCapture(target, api)
    if not cap.isOpened():
        cap.release()
        raise SourceError(cannot_open)
    ok, frame = cap.read()
    if not ok or frame is None:
        cap.release()
        raise SourceError(no_frame)
    return cap, frame


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

    def __init__(self, uri: str, path: Path, loop: bool = False, timeout: float | None = None,
                 realtime: bool = False, phase: float = 0.0) -> None:
        super().__init__(uri)
        self.path = path
        self.loop = loop
        self.realtime = realtime
        self.phase = phase  # realtime: frames come this fraction of a frame interval late (cameras out of step)
        self._clock: float | None = None  # realtime: the monotonic clock at media time 0 (set by the first frame)
        self._wake = threading.Event()  # stop() ends a realtime wait at once
        #: realtime: when the frame just read was due (``perf_counter``): a camera's frame exists from then, so
        #: its latency counts from there, not from a read that began a frame interval earlier and waited
        self.ready_at: float | None = None
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
        self._clock = None
        self._wake.clear()
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

    def expected_frames(self) -> int | None:
        return self._frame_count if self._frame_count > 0 and not self.loop else None

    def _open_blocking(self, _: Any) -> tuple[Any, np.ndarray]:
        return open_capture(str(self.path), f"{self.path}: cannot open as a video (unreadable or unsupported format)",
                            f"{self.path}: no frame could be decoded (damaged or unsupported video)")

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        frame = self._next_frame(out)
        if frame is not None and self.realtime:
            self._pace()
        return frame

    def _pace(self) -> None:
        """Hold the frame until its media time on the clock, counted from the first frame's delivery. A
        pipeline that falls behind takes the late frames as fast as it can until it is back on the clock:
        nothing of a file is dropped, as a camera would drop it (the drop accounting stays the pipeline's)."""
        t = float(self.frame_time or 0.0)
        now = time.monotonic()
        if self._clock is None:
            self._clock = now - t + self.phase / (self.fps or 30.0)
        wait = self._clock + t - now
        if wait > 0:
            self._wake.wait(wait)
        self.ready_at = time.perf_counter()

    def _next_frame(self, out: np.ndarray | None) -> np.ndarray | None:
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
        self._wake.set()
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
        self._large_image = RepeatedWarning(log, "%s: skipped")

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

    def expected_frames(self) -> int | None:
        return None if self.loop else len(self.paths)

    def _decode_next(self) -> np.ndarray | None:
        budget = max_pixels()
        while self._next < len(self.paths):
            path = self.paths[self._next]
            self._next += 1
            try:
                # bounded by the header's size, and from the file's bytes: a name need not be UTF-8
                frame = decode_image_file(path, budget)
            except ImageTooLarge as exc:
                if len(self.paths) == 1:  # a lone image: nothing else to show, so say why in one line
                    raise SourceError(f"{exc}") from None
                self.skip(SKIP_LARGE_IMAGE)
                self._large_image(exc)
                continue
            except ImageSkipped:
                self.skip(SKIP_UNREADABLE_IMAGE)
                self._bad_image(path)
                continue
            self.current = path
            return frame
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
            self._large_image.summary(f"{self.uri}: images over the pixel budget")
            return None
        return _into(out, frame)

    def close(self) -> None:
        self._bad_image.summary(f"{self.uri}: images that could not be decoded")
        self._large_image.summary(f"{self.uri}: images over the pixel budget")
        self._opened = False


def _image_paths(pattern: str) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(pattern) if Path(p).suffix.lower() in IMAGE_SUFFIXES)

