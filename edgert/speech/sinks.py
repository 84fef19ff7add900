"""Where speech events go: JSON Lines files or stdout (``jsonl://PATH``, ``jsonl://-``).

One event per line, as the result types' ``to_dict()`` write them (``type`` is ``segment``, ``wake``
or ``transcript``). Lines are flushed as they are written, so ``tail -f`` and pipes see each event
when it happens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Any

from edgert.errors import SinkError

__all__ = ["EventSink", "open_event_sink"]


class EventSink:
    """A JSON Lines writer for speech events. A context manager."""

    def __init__(self, uri: str, path: str) -> None:
        self.uri = uri
        self.events = 0
        self._own = path != "-"
        if self._own:
            p = Path(path).expanduser()
            if not p.parent.is_dir():
                raise SinkError(f"{uri}: folder {p.parent} does not exist")
            try:
                self._fh: IO[str] = p.open("w", encoding="utf-8")
            except OSError as exc:
                raise SinkError(f"{uri}: cannot write {p}: {exc.strerror}") from None
        else:
            self._fh = sys.stdout

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
