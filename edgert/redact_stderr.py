"""Redacting what C libraries write to file descriptor 2 (OpenCV, FFmpeg, GStreamer), where that can be done.

:mod:`edgert.redact` cleans what edgert itself says (log records, errors, summaries). OpenCV, FFmpeg and
GStreamer write to fd 2 directly, past Python's logging: at OpenCV's default log level they do not quote a
source's URI, but at ``OPENCV_LOG_LEVEL=INFO``/``DEBUG`` OpenCV prints the URI it was asked to open, user info
and all, and a GStreamer pipeline that does not parse is quoted back whole (``location=rtsp://user:pw@...``).

:func:`redact_fd2` puts a pipe in front of fd 2 for the rest of the process: a thread reads it line by line and
writes each line through :func:`~edgert.redact.redact` to the real stderr (the terminal or the journal). Capture
worker processes inherit the pipe, so their C libraries' lines are cleaned too. ``edgert run`` installs it when a
source URI holds a credential. What it cannot do, said plainly:

- a line is written out only once it ends (or 4 KiB of it are there): a C library's partial line waits;
- what was in the pipe when the process is killed (SIGKILL, a crash in C) may be lost, and a crash's own
  message written after the pump thread is gone goes straight to fd 2 unredacted;
- a URI split over two ``write`` calls without a newline (a C library printing it piecewise, or it is longer
  than 4 KiB) may come out unredacted; a library writing to ``/dev/tty`` or its own log file is not touched.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable

from edgert.errors import SourceError
from edgert.redact import expand_env, redact

__all__ = ["redact_fd2", "redact_fd2_for"]

_CHUNK = 4096
_installed: list[tuple[int, int, threading.Thread]] = []  # (saved real fd 2, pipe's write end, the pump)


def _pump(read_fd: int, out_fd: int) -> None:
    pending = b""
    while True:
        try:
            data = os.read(read_fd, _CHUNK)
        except OSError:
            data = b""
        if not data:
            break
        pending += data
        cut = pending.rfind(b"\n")
        if cut >= 0:  # whole lines out, cleaned together (a URI never spans a newline)
            _write(out_fd, pending[:cut + 1])
            pending = pending[cut + 1:]
        if len(pending) >= _CHUNK:  # no newline in sight: let it through cleaned as one piece
            _write(out_fd, pending)
            pending = b""
    if pending:
        _write(out_fd, pending)
    os.close(read_fd)


def _write(fd: int, data: bytes) -> None:
    clean = redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    view = memoryview(clean)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # the real stderr is gone (the terminal closed): nothing to show it to
        view = view[n:]


def redact_fd2() -> bool:
    """Route fd 2 through :func:`~edgert.redact.redact` for the rest of the process (once); False when it was
    already installed or fd 2 is not open."""
    if _installed:
        return False
    try:
        saved = os.dup(2)
    except OSError:
        return False
    read_fd, write_fd = os.pipe()
    thread = threading.Thread(target=_pump, args=(read_fd, saved), name="edgert-stderr-redact", daemon=True)
    thread.start()
    os.dup2(write_fd, 2)
    _installed.append((saved, write_fd, thread))
    atexit.register(_restore)
    return True


def redact_fd2_for(uris: Iterable[str]) -> bool:
    """:func:`redact_fd2` when any of ``uris`` holds a credential, written out or in a ``${VAR}`` that is set."""
    for uri in uris:
        try:
            expanded = expand_env(uri)
        except SourceError:  # a ${VAR} not set: the run will say so; nothing secret to hide yet
            expanded = uri
        if redact(expanded) != expanded:
            return redact_fd2()
    return False


def _restore() -> None:
    """At exit: put the real stderr back and let the pump write out what is left."""
    if not _installed:
        return
    saved, write_fd, thread = _installed.pop()
    import sys

    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr already closed: nothing buffered to keep
    os.dup2(saved, 2)  # fd 2 no longer holds the pipe; closing our end lets the pump see its end
    os.close(write_fd)
    thread.join(2.0)
