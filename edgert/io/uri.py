"""What the source and sink tables share: a test for a URI's scheme, a local path's text, adding a row, and
the names of what a source needs from the machine (rows say it; the service unit orders itself by it)."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["ARGUS", "NETWORK", "always", "file_path_text", "insert_row", "local_file", "no_needs", "nothing", "scheme"]

#: A source that reads a CSI camera through libargus: nvargus-daemon must run, and /tmp/argus_socket be seen.
ARGUS = "argus"
#: A source or sink that talks to another machine: the network must be up first.
NETWORK = "network"


def scheme(*prefixes: str) -> Callable[[str], bool]:
    """A test for URIs that start with one of ``prefixes`` (``"jsonl://"``, ``"rtsp://"``)."""
    return lambda uri: uri.startswith(prefixes)


def always(*needs: str) -> Callable[[str], tuple[str, ...]]:
    """A row's ``needs`` that are the same for every URI of its kind (``always(NETWORK)``)."""
    return lambda uri: needs


def no_needs(uri: str) -> tuple[str, ...]:
    """A row's ``needs`` for kinds that need nothing of the machine."""
    return ()


def nothing(uri: str) -> None:
    """A row's ``reads`` or ``writes`` for kinds that name no local path."""
    return None


def local_file(uri: str) -> str | None:
    """The local path a file URI names (``file://`` optional, ``?options`` dropped); None for another scheme."""
    text = file_path_text(uri).partition("?")[0]
    return None if "://" in text or not text else text


def file_path_text(uri: str) -> str:
    """A local file's or folder's URI without its optional ``file://``."""
    return uri[len("file://"):] if uri.startswith("file://") else uri


def insert_row(table: list[Any], row: Any, before: str | None) -> None:
    """Add ``row`` (with a ``name``) to a table of kinds, ahead of the row named ``before`` (else last); a
    name given twice is a mistake of the code that registers it."""
    names = [existing.name for existing in table]
    if row.name in names:
        raise ValueError(f"a kind named {row.name!r} is registered already")
    table.insert(names.index(before) if before in names else len(table), row)
