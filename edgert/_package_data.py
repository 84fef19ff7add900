"""Files shipped inside the package (HTML page, CUDA kernels, service templates).

``pkgutil.get_data`` rather than ``importlib.resources.files``: the latter needs Python 3.9, and JetPack 5
ships 3.8. It reads through the package's loader, so it works from a wheel, an editable install or a zip.
"""

from __future__ import annotations

import pkgutil

__all__ = ["read_bytes", "read_text"]


def read_bytes(package: str, resource: str) -> bytes:
    """The bytes of ``resource`` (a '/'-separated path relative to ``package``'s folder)."""
    data = pkgutil.get_data(package, resource)
    if data is None:  # a loader without get_data: not one of the ways edgert is installed
        raise FileNotFoundError(f"{package}: cannot read package data {resource}")
    return data


def read_text(package: str, resource: str) -> str:
    return read_bytes(package, resource).decode("utf-8")
