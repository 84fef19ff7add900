"""Where speech events go: JSON Lines files or stdout (``jsonl://PATH``, ``jsonl://-``).

One event per line, as the result types' ``to_dict()`` write them (``type`` is ``segment``, ``wake``
or ``transcript``). Lines are flushed as they are written, so ``tail -f`` and pipes see each event
when it happens.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import IO, Any

from edgert.errors import SinkError
from edgert.output_lock import lock_output

__all__ = ["EventSink", "open_event_sink"]


class EventSink:
    """A JSON Lines writer for speech events. A context manager.

    Made, it holds its file open and locked but untouched; :meth:`begin` truncates it. A run claims every
    sink first and begins them only when all could be claimed, so one bad sink leaves every output alone.
    """

    def __init__(self, uri: str, path: str) -> None:
        self.uri = uri
        self.events = 0
        self._own = path != "-"
        if self._own:
            p = Path(path).expanduser()
            if not p.parent.is_dir():
                raise SinkError(f"{uri}: folder {p.parent} does not exist")
            try:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)  # not truncated before locked
            except OSError as exc:
                raise SinkError(f"{uri}: cannot write {p}: {exc.strerror}") from None
            try:
                lock_output(fd, p)  # one writer per file: a second run fails naming the first
            except BaseException:
                os.close(fd)
                raise
            self._fh: IO[str] = os.fdopen(fd, "w", encoding="utf-8")
        else:
            self._fh = sys.stdout

    def begin(self) -> None:
        """Truncate the file (it was claimed untouched): call once every sink of the run is claimed."""
        if self._own and stat.S_ISREG(os.fstat(self._fh.fileno()).st_mode):
            os.ftruncate(self._fh.fileno(), 0)

    def write(self, event: dict[str, Any]) -> None:
        try:
            self._fh.write(json.dumps(event) + "\n")
            self._fh.flush()
        except OSError as exc:
            raise SinkError(f"{self.uri}: write failed: {exc.strerror}") from None
        self.events += 1

    def close(self) -> None:
        if self._own and not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> EventSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_event_sink(uri: str) -> EventSink:
    text = uri.strip()
    if text.startswith("jsonl://") and text[len("jsonl://"):]:
        return EventSink(text, text[len("jsonl://"):])
    raise SinkError(f"{uri}: speech pipelines write events to jsonl://PATH or jsonl://- (stdout)")
