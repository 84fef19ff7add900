"""Files written whole or not at all, and their hashes.

A file written in place and interrupted (a crash, a full disk, Ctrl-C) is left truncated under its real
name, and the next run trusts it. :func:`write_atomic` writes a temporary file beside the target, syncs
it and renames it over the target (``os.replace`` is atomic on one filesystem), so the target is always
either the old file or the new one.

A writer killed before its rename (SIGKILL, the OOM killer, a power cut) leaves its temporary file: a model or an
engine is tens of MB. Every temporary name here carries the writer's process id (``.NAME.tmp-PID...``), and the
first write into a folder removes the ones of processes that are gone; scratch folders
(:func:`scratch_folder`) do the same in the system's temporary folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["atomic_path", "refuse_replacing_input", "remove_stale_temps", "replace_file", "same_file",
           "scratch_folder", "sha256_file", "write_atomic"]

_cleaned: set[str] = set()  # folders this process has removed dead writers' temporary files from already
_PID_TEMP = re.compile(r"\.tmp-(\d+)(?:-|$)")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def remove_stale_temps(folder: str | Path, prefix: str = ".") -> list[Path]:
    """Remove the temporary files (and folders) under ``folder`` whose name starts with ``prefix`` and carries the
    id of a process that is gone (``NAME.tmp-PID`` or ``NAME.tmp-PID-...``): what killed writers left. Done once
    per folder and process; returns what was removed."""
    key = f"{os.path.abspath(folder)}\0{prefix}"
    if key in _cleaned:
        return []
    _cleaned.add(key)
    removed: list[Path] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _PID_TEMP.search(name) if name.startswith(prefix) else None
        if match is None or _alive(int(match.group(1))):
            continue
        path = Path(folder) / name
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
    return removed


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one existing file (through links, hard links, ``..`` and the like)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_replacing_input(output: str | Path, source: str | Path, flag: str = "-o") -> None:
    """A one-line ConfigError when ``output`` is ``source`` (the same file by any name): a tool writing its
    output atomically would otherwise replace the FP32 model it read with what it made of it."""
    from edgert.errors import ConfigError

    if same_file(output, source) or os.path.abspath(output) == os.path.abspath(source):
        raise ConfigError(f"{flag} {output}: that is the source model {source}; write the output to another file "
                          "(an output never replaces its input)")


@contextlib.contextmanager
def scratch_folder(kind: str) -> Iterator[Path]:
    """A temporary folder (``edgert-KIND.tmp-PID-...`` in the system's temporary folder), removed at the end; the
    ones of killed runs are removed first."""
    base = tempfile.gettempdir()
    remove_stale_temps(base, f"edgert-{kind}.")
    with tempfile.TemporaryDirectory(prefix=f"edgert-{kind}.tmp-{os.getpid()}-", dir=base) as folder:
        yield Path(folder)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends without error.

    For writers that want a file name (``onnx.save``). On an error the temporary file is removed and the
    old ``path`` is untouched.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    remove_stale_temps(target.parent)
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
    remove_stale_temps(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent)
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
