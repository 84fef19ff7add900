"""A headless Chromium for the report pages, and screenshots kept where a person can look at them.

Set ``EDGERT_SCREENSHOTS=DIR`` to keep each page's screenshot there (they go to the test's tmp_path
otherwise).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.io.chromium import Browser, find_chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")
    with Browser(chromium) as b:
        yield b


def screenshot(browser: Browser, tmp_path: Path, name: str, full_page: bool = True) -> np.ndarray:
    """Take a PNG of the page, keep it (``EDGERT_SCREENSHOTS``), return it decoded as a BGR image."""
    cv2 = pytest.importorskip("cv2")
    path = tmp_path / f"{name}.png"
    data = browser.screenshot(path, full_page=full_page)
    keep = os.environ.get("EDGERT_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape[0] > 100 and image.shape[1] > 100
    return np.asarray(image)


def has_color(image: np.ndarray, hex_color: str, min_pixels: int = 30, tolerance: int = 40) -> bool:
    """Whether the screenshot has at least ``min_pixels`` pixels near ``hex_color`` (a drawn series)."""
    rgb = [int(hex_color[i:i + 2], 16) for i in (1, 3, 5)]
    bgr = np.array(rgb[::-1], np.int16)
    close = np.abs(image.astype(np.int16) - bgr).max(axis=2) <= tolerance
    return int(close.sum()) >= min_pixels
