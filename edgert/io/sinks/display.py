"""An OpenCV window (``display://0``).
"""

from __future__ import annotations

import os
import sys

from edgert._lazy import lazy_import
from edgert.errors import SinkError
from edgert.io.sinks.base import (
    FrameResult,
    Sink,
    StreamInfo,
)

__all__ = ["DisplaySink", "from_uri"]


class DisplaySink(Sink):
    """An OpenCV window (needs an OpenCV with a GUI and a display; the pip 'headless' wheel has none)."""

    needs_image = True
    skips_frames = True  # a window that redraws slower than the pipeline shows the newest frame

    def __init__(self, uri: str, title: str = "edgert") -> None:
        super().__init__(uri)
        self.title = title
        self._open = False

    def prepare(self) -> None:
        lazy_import("cv2", "the display window")
        if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            raise SinkError(f"{self.uri}: no display here (DISPLAY is not set). Note: use http://127.0.0.1:8080")

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        cv2 = lazy_import("cv2", "the display window")
        try:
            cv2.namedWindow(self.title, cv2.WINDOW_NORMAL)
        except cv2.error:
            raise SinkError(
                f"{self.uri}: this OpenCV has no GUI support (headless build). "
                "Note: use the web preview http://127.0.0.1:8080 or install opencv-python"
            ) from None
        self._open = True

    def write(self, result: FrameResult) -> None:
        if self._open and result.image is not None:
            cv2 = lazy_import("cv2")
            cv2.imshow(self.title, result.image)
            cv2.waitKey(1)

    def close(self) -> None:
        if self._open:
            cv2 = lazy_import("cv2")
            cv2.destroyWindow(self.title)
            self._open = False


def from_uri(uri: str, title: str = "edgert") -> DisplaySink:
    return DisplaySink(uri, title)
