"""Shared fixtures: where the real assets are, and tiny ONNX models built in code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def assets_dir() -> Path | None:
    path = Path(os.environ.get("EDGERT_ASSETS", ROOT.parent / "shared" / "assets")).resolve()  # tests link to it
    return path if (path / "README.md").exists() else None


@pytest.fixture(scope="session")
def assets() -> Path:
    """The real models and media (../shared/assets or $EDGERT_ASSETS); skips when absent."""
    path = assets_dir()
    if path is None:
        pytest.skip("assets not found: set EDGERT_ASSETS or place ../shared/assets beside the project")
    return path


@pytest.fixture(autouse=True)
def _native_log_variables() -> Iterator[None]:
    """A CLI run in this process (``main([...])``) sets the C libraries' quiet variables in os.environ, where the
    CLI subprocesses of later tests would inherit them as if a user had set them (then ``-v`` shows nothing)."""
    from edgert.cli.native_logs import QUIET_ENV

    saved = {key: os.environ.get(key) for key in QUIET_ENV}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
