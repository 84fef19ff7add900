"""Every frame's :class:`FrameResult` handed to a Python function, on the sink's own thread.
"""

from __future__ import annotations

from typing import Any, Callable

from edgert.io.sinks.base import (
    FrameResult,
    Sink,
    StreamInfo,
)
from edgert.vision.detections import Detections

__all__ = ["CallbackSink"]


class CallbackSink(Sink):
    """Calls ``fn(result)`` with every frame's :class:`FrameResult`, on this sink's own thread.

    The way to get each frame's detections out of a :class:`~edgert.pipeline.Pipeline` without
    subclassing anything::

        def on_frame(result: FrameResult) -> None:
            print(result.index, result.detections.counts())

        Pipeline(config, sinks=[CallbackSink(on_frame)]).run()

    With ``image=True`` the result carries the annotated frame too (and ``result.detections.plot()`` works
    on the raw boxes). The image buffer is reused once ``fn`` returns: copy it to keep it. A callback slower
    than the pipeline gets frames dropped (counted as ``sink:callback://NAME``), never slows the pipeline;
    an exception in it stops this sink (logged), not the pipeline.
    """

    def __init__(self, fn: Callable[[FrameResult], Any], image: bool = False, queue_size: int = 64,
                 name: str | None = None) -> None:
        super().__init__(f"callback://{name or getattr(fn, '__name__', type(fn).__name__)}")
        self.fn = fn
        self.needs_image = image
        self.queue_size = queue_size
        self.info: StreamInfo | None = None

    def open(self, info: StreamInfo) -> None:
        self.info = info

    def write(self, result: FrameResult) -> None:
        if result.image is not None and result.detections.image is None:
            d = result.detections
            result = FrameResult(result.index, result.timestamp,
                                 Detections(d.xyxy, d.confidence, d.class_id, d.names, d.track_id, result.image),
                                 result.image, result.file)
        self.fn(result)

