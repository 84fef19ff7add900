"""What the source and sink tables share to read a URI: a test for a scheme, and a local path's text."""

from __future__ import annotations

from typing import Callable

__all__ = ["file_path_text", "scheme"]


def scheme(*prefixes: str) -> Callable[[str], bool]:
    """A test for URIs that start with one of ``prefixes`` (``"jsonl://"``, ``"rtsp://"``)."""
    return lambda uri: uri.startswith(prefixes)


def file_path_text(uri: str) -> str:
    """A local file's or folder's URI without its optional ``file://``."""
    return uri[len("file://"):] if uri.startswith("file://") else uri
