"""Files written whole or not at all, and their hashes.

A file written in place and interrupted (a crash, a full disk, Ctrl-C) is left truncated under its real
name, and the next run trusts it. :func:`write_atomic` writes a temporary file beside the target, syncs
it and renames it over the target (``os.replace`` is atomic on one filesystem), so the target is always
either the old file or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["atomic_path", "replace_file", "sha256_file", "write_atomic"]


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends without error.

    For writers that want a file name (``onnx.save``). On an error the temporary file is removed and the
    old ``path`` is untouched.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the data is on disk before the name points at it
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _sync_dir(target.parent)


def write_atomic(path: str | Path, data: bytes | str | Callable[[Path], None]) -> Path:
    """Write ``data`` (bytes, text as UTF-8, or a function given the temporary path) to ``path`` atomically."""
    target = Path(path)
    with atomic_path(target) as tmp:
        if callable(data):
            data(tmp)
        else:
            tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return target


def replace_file(path: str | Path, data: bytes | str, mode: int = 0o644, make_folder: bool = True) -> None:
    """Write ``data`` (text as UTF-8) to a unique temporary file beside ``path`` and rename it over ``path``,
    with permissions ``mode`` whatever the umask (``mkstemp`` makes 0600; engines, caches and unit files are
    read by other users). A killed writer never leaves half a file; unlike :func:`write_atomic` it does not
    sync (large engines, caches that can be rebuilt). ``make_folder=False``: a missing folder is an error
    (``FileNotFoundError``), for a writer whose folder being taken away must stop it, not be undone."""
    target = Path(path)
    if make_folder:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _sync_dir(folder: Path) -> None:
    """Make the rename itself durable (the directory entry); not every filesystem allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync a directory: the rename itself has been done
        pass
    finally:
        os.close(fd)
