"""Progress of a long command on stderr: a tqdm bar on a terminal, a few plain lines otherwise, none when quiet.

Commands that take more than a few seconds (bench, val, run on files, demo, convert, rebatch, compare) show
where they are. A bar on a terminal; in a log or a pipe, where a bar's carriage returns pile up, one line at
the start, one per quarter of a known total (or one every ``PLAIN_EVERY_S`` when the total is unknown) and
one at the end. ``--json`` (the output is for a program) keeps it quiet.

    with Progress("bench", total=220, unit="inference", quiet=args.json) as p:
        for _ in range(220):
            work()
            p.update()
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import IO, Any

__all__ = ["PLAIN_EVERY_S", "Progress"]

#: Plain mode without a total: a line at most this often (seconds).
PLAIN_EVERY_S = 10.0


def _columns(stream: IO[str]) -> int | None:
    """80 where the terminal reports a width of 0, else None (tqdm follows the terminal's width)."""
    try:
        return 80 if os.get_terminal_size(stream.fileno()).columns == 0 else None
    except (OSError, ValueError, AttributeError):
        return None


class Progress:
    """One step's progress; ``update(n)`` after each unit of work, ``close()`` (or the ``with`` block) at its end."""

    def __init__(self, label: str, total: int | None = None, unit: str = "it", quiet: bool = False,
                 stream: IO[str] | None = None, terminal: bool | None = None) -> None:
        self.label = label
        self.total = total if total and total > 0 else None
        self.unit = unit
        self.count = 0
        self._stream = stream if stream is not None else sys.stderr
        self._quiet = quiet
        self._terminal = self._stream.isatty() if terminal is None else terminal
        self._bar: Any = None
        self._started = time.monotonic()
        self._last_line = self._started
        self._quarter = 0
        self._closed = False
        if quiet:
            return
        if self._terminal:
            from tqdm import tqdm

            width = _columns(self._stream)  # a terminal that reports no size (a serial console): tqdm draws nothing
            self._bar = tqdm(total=self.total, desc=label, unit=unit, file=self._stream, dynamic_ncols=not width,
                             ncols=width, nrows=24 if width else None, leave=False)
        elif unit != "step":  # steps announce themselves (step())
            self._line(f"{self.total} {unit}s" if self.total else "started")

    def _line(self, text: str) -> None:
        print(f"edgert: {self.label}: {text}", file=self._stream, flush=True)

    def update(self, n: int = 1, note: str | None = None) -> None:
        self.count += n
        if self._quiet or self._closed:
            return
        if self._bar is not None:
            self._bar.update(n)
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            return
        now = time.monotonic()
        if self.total:
            quarter = min(3, 4 * self.count // self.total)  # the end has its own line (close)
            if quarter > self._quarter:
                self._quarter = quarter
                self._line(f"{self.count}/{self.total} {self.unit}s ({100 * self.count // self.total}%)"
                           + (f", {note}" if note else ""))
        elif now - self._last_line >= PLAIN_EVERY_S:
            self._last_line = now
            self._line(f"{self.count} {self.unit}s" + (f", {note}" if note else ""))

    def step(self, text: str) -> None:
        """One step of a few (a conversion, then its check): a plain line for each, or the bar's note."""
        if not self._quiet and self._bar is None and not self._closed:
            shown = f"{self.count + 1}/{self.total} " if self.total else ""
            self._line(f"{shown}{text}")
            self.count += 1
            return
        self.update(1, text)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif not self._quiet:
            self._line(f"done, {self.count} {self.unit}s in {time.monotonic() - self._started:.1f} s")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None and self._bar is None:
            self._closed = True  # a failed step: its error line is enough, no "done"
        self.close()
