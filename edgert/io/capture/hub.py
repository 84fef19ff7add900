"""One pipe for the frame messages of every capture worker a collector reads: one read per wake, not one per source.

Why: with a pipe per worker, the collector (:mod:`edgert.pipeline.collector`) made one ``read`` per ready pipe per
wake, at 16 streams about 0.75 system calls a frame (docs/pipeline.md), each one a release and a
reacquisition of the interpreter lock that the slot threads feeding the engine wait on. Through one pipe shared by
the workers, a wake is one read, whatever the number of sources.

A record is written with one ``write`` of at most ``PIPE_BUF`` bytes, which POSIX makes atomic on a pipe: records
of several workers never interleave, and a worker killed mid-write has written all of its record or none of it.
A record is an 8-byte header (the source's tag, the body's length, little-endian) and the pickled message. What
does not fit (a frame sent through the pipe, an error text) goes through the worker's own pipe, which stays what
says that the worker is gone (its end closes; the hub's does not, the other workers still hold it).

Order: a worker writes its records and then its own pipe's messages, each write finished before the next, so when
the parent has read a message of the own pipe and then reads the hub to empty, every record written before that
message is in hand (:meth:`ProcessCaptureSource.take
<edgert.io.capture.process.ProcessCaptureSource.take>` merges the two by frame number).
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import select
import struct
from typing import Any

__all__ = ["HUB_RECORD_BYTES", "HubWriter", "MessageHub"]

#: The most a record may take (header included): a pipe's atomic write (4 096 bytes on Linux, 512 by POSIX).
HUB_RECORD_BYTES = int(getattr(select, "PIPE_BUF", 512))
_HEADER = struct.Struct("<II")  # tag, body length
_READ_BYTES = 1 << 20  # a pipe's capacity at most (the one asked for below): one read empties it
#: What the hub asks to hold (Linux's default ceiling for an unprivileged pipe, fs.pipe-max-size): every worker's
#: read-ahead records at once (some 130 bytes each, ~6 a source: 64 KiB, the default, would hold ~60 sources'
#: with the kernel's page packing) so that no worker waits on the hub while the collector is busy.
_HUB_BYTES = 1 << 20
#: Linux's fcntl command number (F_LINUX_SPECIFIC_BASE + 7): Python names it only from 3.10, JetPack 5 has 3.8
_F_SETPIPE_SZ = 1031


class MessageHub:
    """The parent's end: :meth:`route` a tag to an inbox, hand :attr:`writer` to the workers
    (:meth:`~edgert.io.capture.process.ProcessCaptureSource.join_hub`), then :meth:`close_writer`; each
    :meth:`read` appends whole messages to their inboxes and says which tags got any."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)  # the workers' end stays blocking: a full hub holds them (back-pressure)
        with contextlib.suppress(OSError, ImportError):  # not Linux, or a lower ceiling: the default size works
            import fcntl

            fcntl.fcntl(self._w, getattr(fcntl, "F_SETPIPE_SZ", _F_SETPIPE_SZ), _HUB_BYTES)
        self._routes: dict[int, collections.deque[tuple[Any, ...]]] = {}
        self._partial = b""
        self.ended = False  # every writer is gone (the read end reads EOF): nothing more will come

    def fileno(self) -> int:
        return self._r

    @property
    def writer(self) -> int:
        """The write end, for the workers (-1 once :meth:`close_writer` closed the parent's copy)."""
        return self._w

    def route(self, tag: int, inbox: collections.deque[tuple[Any, ...]]) -> None:
        self._routes[tag] = inbox

    def close_writer(self) -> None:
        """The parent's copy of the write end: closed once every worker has its own, so that the hub reads EOF when
        the last worker is gone."""
        if self._w >= 0:
            os.close(self._w)
            self._w = -1

    def read(self) -> list[int]:
        """Read what the hub holds (non-blocking: nothing there is no error) into the inboxes; the tags that got
        messages, with repeats. Reads until a read comes back short, so the hub was empty at that moment."""
        touched: list[int] = []
        while True:
            try:
                data = os.read(self._r, _READ_BYTES)
            except BlockingIOError:
                return touched
            if not data:
                self.ended = True
                return touched
            full = len(data) == _READ_BYTES  # more may wait behind it
            if self._partial:  # a record cut by the previous read (one that filled its whole size)
                data = self._partial + data
            pos = self._parse(data, touched)
            self._partial = data[pos:]
            if not full:
                return touched

    def _parse(self, data: bytes, touched: list[int]) -> int:
        """Whole records of ``data`` to their inboxes and ``touched``; where the first incomplete one starts."""
        routes, loads, unpack = self._routes, pickle.loads, _HEADER.unpack_from
        pos, end = 0, len(data)
        while end - pos >= 8:
            tag, n = unpack(data, pos)
            start = pos + 8
            if end - start < n:
                break
            pos = start + n
            inbox = routes.get(tag)
            if inbox is not None:  # a tag nobody routes: a source closed already, its frames go with it
                inbox.append(loads(data[start:pos]))
                touched.append(tag)
        return pos

    def close(self) -> None:
        self.close_writer()
        with contextlib.suppress(OSError):  # closed already: close is safe to call twice
            os.close(self._r)
        self._r = -1
        self._routes.clear()


class HubWriter:
    """A worker's end: :meth:`send` one message as one atomic record, or False when it is too large for one."""

    def __init__(self, fd: int, tag: int) -> None:
        self.fd = fd
        self.tag = tag

    def send(self, msg: tuple[Any, ...]) -> bool:
        body = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        if len(body) + _HEADER.size > HUB_RECORD_BYTES:
            return False
        os.write(self.fd, _HEADER.pack(self.tag, len(body)) + body)  # blocking and <= PIPE_BUF: whole, atomic
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
