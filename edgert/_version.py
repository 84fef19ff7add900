"""The package version, in a module of its own so that any layer may read it without importing edgert's API."""

from __future__ import annotations

__version__ = "0.1.0"
