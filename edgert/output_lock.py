"""One writer per output file: an advisory ``flock`` that names the process holding it.

Two runs writing one file interleave their writes and corrupt it silently (NUL blocks, mixed and lost
lines). Each run takes an exclusive lock on the files it writes, so the second one fails at start, in one
line, naming the first one's PID (read back from /proc/locks).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

from edgert.errors import SinkError

__all__ = ["lock_output"]

log = logging.getLogger(__name__)


def _lock_holder(fd: int) -> int | None:
    """The PID holding a flock on ``fd``'s file, from /proc/locks (Linux), or None when it cannot be told."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" ("->" marks a waiter: not the holder)
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == dev:
                    return int(parts[4])
    except (OSError, ValueError):  # no /proc/locks (not Linux) or a line it cannot read: holder unknown
        pass
    return None


def lock_output(fd: int, path: str | Path) -> None:
    """Take an exclusive advisory lock (``flock``) on the regular file open at ``fd``, or fail naming the holder.

    Two runs writing one file interleave and corrupt it; the lock makes the second one fail at start in
    one line. Pipes, devices and /dev/stdout are not locked. The lock goes with the descriptor's close
    (or the process's death), so a killed run never leaves a stale lock behind.
    """
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _lock_holder(fd)
        if pid == os.getpid():
            raise SinkError(f"{path}: two sinks of this run write the same file") from None
        who = f"process {pid}" if pid is not None else "another process"
        raise SinkError(f"{path}: {who} is writing this file (locked). "
                        "Note: stop that run or write to another file") from None
    except OSError as exc:  # e.g. ENOLCK on some network filesystems: write unlocked rather than not at all
        log.warning("%s: cannot lock the output (%s); another run could write it too", path, exc.strerror)
