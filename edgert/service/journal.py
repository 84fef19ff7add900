"""Log lines journald files under the right priority.

When a service's stderr goes to the journal, systemd sets ``JOURNAL_STREAM=DEV:INODE`` (the stream's
device and inode). A line that starts with ``<N>`` (sd-daemon(3): 3 error, 4 warning, 6 info, 7 debug) is
stored with that priority, so ``journalctl -u edgert-camera -p warning`` shows warnings and errors only.
Anywhere else (a terminal, a file, a pipe) lines stay plain.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

__all__ = ["JournalFormatter", "stderr_is_journal", "syslog_priority"]


def stderr_is_journal(env: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """Whether ``fd`` is the stream systemd connected to the journal (not merely an inherited variable)."""
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def syslog_priority(levelno: int) -> int:
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


class JournalFormatter(logging.Formatter):
    """Prefixes every line of a record (a traceback too: journald splits lines) with ``<priority>``."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))
