"""Live sources: :class:`LiveSource` (a grabber thread keeping the newest frame, reconnecting with backoff,
stall detection) and the openers of V4L2 cameras, GStreamer pipelines and FFmpeg streams."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgert.config import SourceConfig
from edgert.errors import SourceError, last_line
from edgert.io.capture_clock import capture_clock
from edgert.io.sources.base import LIVE_TIMEOUT_S, FrameSource, _cv2, log
from edgert.io.sources.gstreamer import gstreamer_available
from edgert.redact import redact


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
                 first_frame_timeout: float = 15.0, kind: str = "live", timeout: float | None = None,
                 diagnose: Callable[[], str | None] | None = None) -> None:
        super().__init__(uri)
        self.kind = kind
        self._opener = opener
        #: Asked once when the source gives up at start: why it could not be opened (refused, DNS, 401 ...),
        #: which OpenCV does not say (edgert.io.sources.diagnose).
        self._diagnose = diagnose
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
        self.reconnecting = False  # its grabber has no stream and is reconnecting (metrics, summary)

    def _connect(self) -> Any:
        try:
            cap = self._opener()
        except Exception as exc:  # OpenCV raises cv2.error, a plain Exception subclass
            raise SourceError(f"{redact(self.uri)}: cannot open: {redact(last_line(exc))}") from exc
        if cap is None or not cap.isOpened():
            if cap is not None:
                cap.release()
            raise SourceError(f"{redact(self.uri)}: cannot open (device busy or absent, or stream unreachable)")
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
        self._latest_time = capture_clock()
        self._fresh = True
        self._stopping.clear()
        self._start_grabber(cap, np.empty_like(frame))
        self._opened = True
        log.info("opened %s: %dx%d at %s fps", redact(self.uri), self.width, self.height, self.fps)

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
                    cause = self._cause() if not self._stopping.is_set() else None
                    message = f"{self.uri}: cannot open: {cause}" if cause else str(exc)
                    if attempt == 1:
                        raise SourceError(message) from exc.__cause__
                    raise SourceError(f"{message} ({attempt} attempts in {self.timeout:g} s)") from None
                # -v shows each attempt; by default the one line at the end says what happened and why
                log.info("%s; retrying in %.1f s (attempt %d)", exc, delay, attempt)
                if self._stopping.wait(delay):
                    raise SourceError(f"{self.uri}: stopped before it could be opened") from None

    def _cause(self) -> str | None:
        if self._diagnose is None:
            return None
        try:
            return self._diagnose()
        except Exception:  # a diagnosis that fails must not hide the error it was asked about
            log.debug("%s: diagnosis failed", self.uri, exc_info=True)
            return None

    def open_in_background(self) -> None:
        """Keep connecting in the grabber thread with the backoff of a stream lost mid-run, and let frames flow
        once it is up (its size and rate are learnt from the first frame): for a source still down after
        ``timeout`` at start while others opened (:mod:`edgert.pipeline.startup`). Its first connection counts
        as a reconnect."""
        self._stopping.clear()
        self.reconnecting = True
        self._start_grabber(None, None)
        self._opened = True

    def _learn(self, cap: Any, frame: np.ndarray) -> None:
        """Size and rate from the first frame of a source opened in the background."""
        self.height, self.width = int(frame.shape[0]), int(frame.shape[1])
        try:
            fps = float(cap.get(_cv2().CAP_PROP_FPS) or 0.0)
        except Exception:  # a driver that cannot say: the rate stays unknown
            fps = 0.0
        self.fps = fps if 0 < fps < 1000 else None
        log.info("opened %s: %dx%d at %s fps", redact(self.uri), self.width, self.height, self.fps)

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
                    self.reconnecting = True
                    delay = min(self._max_backoff, self._backoff * (2 ** attempt))
                    attempt += 1
                    log.warning("%s: reconnecting in %.1f s (attempt %d)", redact(self.uri), delay, attempt)
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
                    self.reconnecting = False
                    log.warning("%s: reconnected", redact(self.uri))
                    attempt = 0
                try:
                    ok, frame = cap.read(spare) if spare is not None else cap.read()
                except Exception as exc:  # a driver error mid-stream: treat like a lost stream
                    log.warning("%s: read failed: %s", redact(self.uri), last_line(exc))
                    ok, frame = False, None
                if not ok or frame is None:
                    if self._current(generation):
                        log.warning("%s: stream stopped delivering frames", redact(self.uri))
                    cap.release()
                    cap = None
                    continue
                if not self.width:
                    self._learn(cap, frame)
                with self._cond:
                    if generation != self._generation:
                        break  # abandoned while reading: the frame is not ours to publish
                    if self._fresh:
                        self.dropped += 1  # the pipeline never took the previous frame: it is stale now
                    # Swap buffers: the grabber writes the next frame into the one just released.
                    latest = self._latest
                    spare = latest if latest is not None and latest.shape == frame.shape else None
                    self._latest = frame
                    self._latest_time = capture_clock()  # when the frame arrived, on a clock that never steps
                    self._fresh = True
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
                if remaining <= 0 and not self.width:
                    deadline = time.monotonic() + self.timeout  # never up yet: its grabber is connecting, not stuck
                    continue
                if remaining <= 0:
                    self.stalls += 1
                    log.warning("%s: no frame for %g s: the stream has stalled, reconnecting", redact(self.uri),
                                self.timeout)
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

