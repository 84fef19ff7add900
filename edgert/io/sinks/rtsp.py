"""Publishing annotated frames over RTSP through GStreamer (``rtsp://server:8554/edgert``).

The stream's size is its source's: known at open for a source that opened, learnt from the first frame for a
live source still connecting at start (reconnected in the background), so the publisher starts then, as the
video file sink's writer does, never at 0x0.
"""

from __future__ import annotations

from typing import Any

from edgert._lazy import lazy_import
from edgert.errors import SinkError
from edgert.io.sinks.base import (
    FrameResult,
    Sink,
    StreamInfo,
)

__all__ = ["RtspSink", "from_uri", "rtsp_out_pipeline"]


def rtsp_out_pipeline(uri: str, fps: float, jetson: bool = False, bitrate_kbps: int = 4000) -> str:
    """appsrc -> H.264 -> rtspclientsink (publishes to an RTSP server at ``uri``)."""
    if jetson:
        encode = (
            "videoconvert ! video/x-raw, format=(string)BGRx ! nvvidconv ! "
            "video/x-raw(memory:NVMM), format=(string)NV12 ! "
            f"nvv4l2h264enc insert-sps-pps=true bitrate={bitrate_kbps * 1000} ! h264parse"
        )
    else:
        encode = (
            "videoconvert ! video/x-raw, format=(string)I420 ! "
            f"x264enc tune=zerolatency speed-preset=ultrafast bitrate={bitrate_kbps} "
            f"key-int-max={max(1, round(fps))} ! "
            "h264parse"
        )
    return f"appsrc is-live=true ! video/x-raw, format=(string)BGR ! {encode} ! rtspclientsink location={uri}"


class RtspSink(Sink):
    """Annotated frames published over RTSP through GStreamer (JetPack's OpenCV has it)."""

    needs_image = True

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self._writer: Any = None
        self._size = (0, 0)
        self._fps = 30.0
        self._awaiting = False  # opened with no frame size yet: the publisher starts on the first frame

    def prepare(self) -> None:
        from edgert.io.sources import gstreamer_available

        lazy_import("cv2", "RTSP output")
        if not gstreamer_available():
            raise SinkError(
                f"{self.uri}: RTSP output needs OpenCV built with GStreamer (this one is not). "
                "Note: use the web preview http://127.0.0.1:8080, or JetPack's python3-opencv"
            )

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        self._fps = info.fps or 30.0
        self._awaiting = True
        if (info.width or 0) > 0 and (info.height or 0) > 0:
            self._start((int(info.width), int(info.height)))
        # else a live source still connecting: the publisher starts on its first frame, at that frame's size

    def _start(self, size: tuple[int, int]) -> None:
        cv2 = lazy_import("cv2", "RTSP output")
        from edgert.platform import jetson_info

        self._awaiting = False
        pipeline = rtsp_out_pipeline(self.uri, self._fps, jetson=bool(jetson_info().get("is_jetson")))
        self._size = size
        writer = cv2.VideoWriter(pipeline, cv2.CAP_GSTREAMER, 0, self._fps, size, True)
        if not writer.isOpened():
            writer.release()
            raise SinkError(f"{self.uri}: GStreamer could not start the RTSP publisher (is an RTSP server there?)")
        self._writer = writer

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) the stream is published at; (0, 0) until the publisher has started."""
        return self._size

    def write(self, result: FrameResult) -> None:
        if result.image is None:
            return
        if self._writer is None and self._awaiting:
            self._start((int(result.image.shape[1]), int(result.image.shape[0])))
        if self._writer is not None:
            image = result.image
            if (image.shape[1], image.shape[0]) != self._size:
                image = lazy_import("cv2").resize(image, self._size)
            self._writer.write(image)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None


def from_uri(uri: str, title: str = "edgert") -> RtspSink:
    return RtspSink(uri)
