"""A live source's capture worker that dies is started again, as a stream that is lost is reconnected.

A worker process can die under a camera: a driver's crash, the OOM killer, a stray ``kill``. For a live source
that used to end the source for good while the run went on (``reconnecting 0`` in the metrics, exit 0): one
camera lost until someone restarted the service. :class:`WorkerRestarts` gives
:class:`~edgert.io.capture.process.ProcessCaptureSource` a ``read`` that, when the worker's pipe ends under a
live source, starts a new worker after the backoff :class:`~edgert.io.sources.LiveSource` uses after a loss
(0.5 s doubling to 10 s, back to 0.5 s after a frame), with ``reconnecting`` set and ``reconnects`` counted
meanwhile (the summary and ``/metrics``); the new worker maps a new ring, the old one is unmapped once the
pipeline's frames over it are gone. A file's worker is not restarted: its frames would start over.
"""

from __future__ import annotations

import abc
import logging
from typing import Any

import numpy as np

from edgert.errors import SourceError
from edgert.redact import redact

__all__ = ["BACKOFF_S", "MAX_BACKOFF_S", "WorkerRestarts"]

log = logging.getLogger("edgert.io.capture.process")

#: The reconnect backoff of a live source (LiveSource's defaults): the first wait, and the longest.
BACKOFF_S, MAX_BACKOFF_S = 0.5, 10.0
_OPEN_TIMEOUT_S = 60.0  # spawning + importing OpenCV + opening the source


class WorkerRestarts(abc.ABC):
    """The restart half of :class:`~edgert.io.capture.process.ProcessCaptureSource` (see the module)."""

    worker_restarts = 0  # workers started again after one died (counted in reconnects too)
    _died = False  # set when the worker's pipe ended (the process gone), not when it reported an error
    _restart_attempt = 0  # restarts since the last frame: the backoff's exponent
    _attach_args: tuple[int, Any] | None = None  # (frames, register) of the first ring, for the next ones

    # Provided by ProcessCaptureSource.
    uri: str
    live: bool
    reconnecting: bool
    reconnects: int
    end_reason: str | None
    _stopping: Any
    _config: Any

    @abc.abstractmethod
    def _read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        """One frame from the current worker (ProcessCaptureSource's own read, which this class wraps)."""

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        while True:
            try:
                frame = self._read(out)
            except SourceError as exc:
                if not (self.live and self._died):
                    raise
                if not self._restart(str(exc)):
                    self.end_reason = "stopped"
                    return None
                out = None  # it lay in the old ring: nothing to give back to the new worker
                continue
            if frame is not None:
                self._restart_attempt = 0
            return frame

    def _restart(self, why: str) -> bool:
        """Start a new worker after the backoff; False when the run stops first."""
        self._died = False
        self.worker_restarts += 1
        self.reconnects += 1
        self.reconnecting = True
        delay = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** min(self._restart_attempt, 8))
        self._restart_attempt += 1
        log.warning("%s; starting another in %.1f s (restart %d)", redact(why), delay, self.worker_restarts)
        if self._stopping.wait(delay):
            return False
        self._retire()
        frames, register = self._attach_args or (4, None)
        self.start()  # type: ignore[attr-defined]
        timeout = _OPEN_TIMEOUT_S + float(getattr(self._config, "timeout_s", None) or 0.0)
        msg = self._recv(timeout, "reading")  # type: ignore[attr-defined]
        if msg is None:
            return False
        if msg[0] == "opened":
            self._opened_as(msg[1])  # type: ignore[attr-defined]
            self.attach(frames, register)  # type: ignore[attr-defined]
            self.reconnecting = False
            log.warning("%s: capture worker restarted", redact(self.uri))
        elif msg[0] == "down":  # the camera is not back yet: the new worker reconnects it in the background
            self._send(("background",))  # type: ignore[attr-defined]
            self._late = (frames, register)
        else:
            raise SourceError(msg[1])
        return True

    def _retire(self) -> None:
        """Let go of the dead worker: its pipe, its process, its ring (unmapped once no frame views it)."""
        ring, conn, proc = self._ring, self._conn, self._proc
        self._ring = self._conn = self._proc = None
        self._fd, self._poller, self._held, self._late, self._ended, self._expected = -1, None, None, None, False, 0
        self._inbox.clear()
        self._partial = bytearray()
        self._pipe_closed = False
        if conn is not None:
            conn.close()
        if proc is not None:
            proc.join(timeout=1.0)
            if proc.is_alive():  # pragma: no cover - its pipe ended, so it is on its way out
                proc.kill()
                proc.join(timeout=1.0)
        if ring is not None:
            ring.close()

    # Attributes of ProcessCaptureSource that _retire resets.
    _ring: Any
    _conn: Any
    _proc: Any
    _fd: int
    _poller: Any
    _held: Any
    _late: Any
    _ended: bool
    _expected: int
    _inbox: Any
    _partial: bytearray
    _pipe_closed: bool
