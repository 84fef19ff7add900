"""``jsonl://PATH`` and ``jsonl://-`` (stdout), parsed in one place: the sink, the sink table's written-path
check, the config loader's relative paths and the command line's stdout rule all read a URI through here."""

from __future__ import annotations

__all__ = ["JSONL", "STDOUT", "jsonl_file", "jsonl_path", "writes_stdout"]

JSONL = "jsonl://"
#: The path that means stdout.
STDOUT = "-"


def jsonl_path(uri: str) -> str | None:
    """What follows ``jsonl://`` (``-`` for stdout, ``""`` when nothing does); None for another scheme."""
    text = uri.strip()
    return text[len(JSONL):] if text.startswith(JSONL) else None


def jsonl_file(uri: str) -> str | None:
    """The file a ``jsonl://`` URI writes; None for stdout, an empty path or another scheme."""
    path = jsonl_path(uri)
    return None if path in (None, "", STDOUT) else path


def writes_stdout(uri: str) -> bool:
    """Whether ``uri`` is ``jsonl://-``: its events own stdout, so a summary goes to stderr."""
    return jsonl_path(uri) == STDOUT
