"""Shared fixtures: where the real assets are, and tiny ONNX models built in code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def assets_dir() -> Path | None:
    path = Path(os.environ.get("EDGERT_ASSETS", ROOT.parent / "shared" / "assets"))
    return path if (path / "README.md").exists() else None


@pytest.fixture(scope="session")
def assets() -> Path:
    """The real models and media (../shared/assets or $EDGERT_ASSETS); skips when absent."""
    path = assets_dir()
    if path is None:
        pytest.skip("assets not found: set EDGERT_ASSETS or place ../shared/assets beside the project")
    return path
