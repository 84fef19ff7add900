"""What the source and sink tables share: a test for a URI's scheme, a local path's text, adding a row."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["file_path_text", "insert_row", "scheme"]


def scheme(*prefixes: str) -> Callable[[str], bool]:
    """A test for URIs that start with one of ``prefixes`` (``"jsonl://"``, ``"rtsp://"``)."""
    return lambda uri: uri.startswith(prefixes)


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
