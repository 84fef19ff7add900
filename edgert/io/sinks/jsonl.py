"""JSON Lines: one record per frame (and one per analytics event), to a file or stdout (``jsonl://-``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import sys
import time
from pathlib import Path

from edgert.errors import OutputClosed, SinkError
from edgert.io.sinks.base import (
    FrameResult,
    Sink,
    StreamInfo,
    claim_file,
    is_deleted,
    result_records,
    unlink_quietly,
)
from edgert.io.sinks.reopen import reopen_generation
from edgert.jsonl_uri import jsonl_path

__all__ = ["JsonlSink", "from_uri"]

log = logging.getLogger(__name__)


class JsonlSink(Sink):
    """One JSON object per frame: ``{"frame", "timestamp", "detections": [...]}``, then one per analytics
    event of that frame: ``{"type": "line_cross", "line", "track_id", "class", "direction", "time", "frame"}``.

    Each line goes out in one ``write`` call and is flushed at once, so a process killed at any moment
    leaves only whole lines; the file is fsynced at most every :attr:`fsync_every_s` while events come (a
    power cut loses at most that much: one fsync costs about a millisecond on a Jetson's eMMC, nothing beside
    a frame) and at close. When a write fails (a full disk), the file is cut back to its last whole line and
    the sink fails; a file deleted mid-run fails it too.

    Rotation: the file is opened ``O_APPEND``, so logrotate's ``copytruncate`` leaves no hole of NUL bytes (the
    next line goes to the truncated file's start); after ``create`` mode's rename, SIGHUP (``postrotate``) makes
    the sink open the path again (:mod:`edgert.io.sinks.reopen`).
    """

    queue_size = 1024  # events are small and cheap: a deep queue rides out a slow disk
    lossless = True
    fsync_every_s = 5.0

    def __init__(self, uri: str, path: str) -> None:
        super().__init__(uri)
        self.path = path
        self._fd: int | None = None
        self._stdout = path == "-"
        self._created = False  # prepare() made the file: a run that never opens it removes it again
        self._opened = False
        self._regular = False
        self.lines = 0
        self._generation = reopen_generation()
        self._synced = time.monotonic()

    def prepare(self) -> None:
        if self._stdout or self._fd is not None:
            return
        self._fd, self._created = claim_file(Path(self.path), "events", append=True)
        self._regular = stat.S_ISREG(os.fstat(self._fd).st_mode)

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        if self._fd is not None and self._regular:
            os.ftruncate(self._fd, 0)
        self._generation = reopen_generation()
        self._opened = True

    def write(self, result: FrameResult) -> None:
        records = result_records(result)
        if not records:
            return
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        if self._stdout:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except BrokenPipeError:
                raise OutputClosed("jsonl://-: stdout was closed by its reader") from None
        elif self._fd is not None:
            if self._generation != reopen_generation():
                self._reopen()
            view = memoryview(data)
            try:
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
            except OSError as exc:
                self._cut_to_last_line(len(data) - len(view))
                raise SinkError(f"{self.path}: writing events failed: {exc.strerror or exc}") from None
            if self._regular and is_deleted(self._fd):
                raise SinkError(f"{self.path}: the file was deleted while the run wrote it")
            if self._regular and time.monotonic() - self._synced >= self.fsync_every_s:
                self._sync()
        self.lines += 1

    def _sync(self) -> None:
        self._synced = time.monotonic()
        if self._fd is not None:
            with contextlib.suppress(OSError):  # a pipe or a special file cannot be synced; a full disk failed already
                os.fsync(self._fd)

    def _reopen(self) -> None:
        """SIGHUP: the file as it is now at the path (a rotated one was renamed away), appended to."""
        self._generation = reopen_generation()
        old = self._fd
        self._sync()
        self._fd, self._created = None, False
        if old is not None:
            os.close(old)  # releases the lock on the rotated file
        self._fd, _ = claim_file(Path(self.path), "events", append=True)
        self._regular = stat.S_ISREG(os.fstat(self._fd).st_mode)
        log.info("%s: reopened (SIGHUP)", self.path)

    def _cut_to_last_line(self, partial: int) -> None:
        """After a failed write of which ``partial`` bytes went out: the file ends on its last whole line again (a
        cut object is no event)."""
        if self._fd is None or not self._regular or not partial:
            return
        try:
            os.ftruncate(self._fd, max(0, os.fstat(self._fd).st_size - partial))
        except OSError as exc:
            log.error("%s: cannot cut the file back to its last whole line: %s", self.path, exc.strerror)

    def close(self) -> None:
        if self._fd is not None:
            if self._opened:
                self._sync()
            os.close(self._fd)  # releases the lock
            self._fd = None
            if self._created and not self._opened:  # prepared for a run that never started
                unlink_quietly(Path(self.path))


def from_uri(uri: str, title: str = "edgert") -> JsonlSink:
    path = jsonl_path(uri)
    if not path:
        raise SinkError(f"{uri}: expected jsonl://PATH or jsonl://- for stdout")
    return JsonlSink(uri, path)
