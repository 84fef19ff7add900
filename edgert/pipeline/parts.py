"""What the pipeline assumes of the parts it is given: a source (:class:`PipelineSource`), a sink as it may be
named (:data:`SinkSpec`), and the JSON-like records it hands out (:data:`JSONDict`).

:class:`PipelineSource` is the members of :class:`~edgert.io.sources.FrameSource`, which an audio source
(:class:`~edgert.io.audio_sources.AudioFrames`) and a preloaded file
(:class:`~edgert.pipeline.preload.PreloadedSource`) have too. What only some sources have (``start`` and ``attach``
of a capture worker, ``meta`` of an audio chunk, ``current`` of a folder, ``lends_buffers``, ``reconnects``) is
asked for with ``getattr`` where it is used.

The lowest module of the pipeline: it imports nothing of edgert at run time, so every other one may import it.
The processor's interface is :class:`edgert.pipeline.processor.Processor`, an observer's
:class:`edgert.pipeline.observer.PipelineObserver`, a sink's :class:`edgert.io.sinks.Sink`.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Dict, Protocol, Union  # typing's Callable: subscripted at run time

import numpy as np

if TYPE_CHECKING:
    from edgert.io.sinks import FrameResult, Sink

__all__ = ["JSONDict", "PipelineSource", "SinkSpec"]

#: A sink as the pipeline is given one: a URI of the sink registry, an open :class:`~edgert.io.sinks.Sink`,
#: or a callable that takes each :class:`~edgert.io.sinks.FrameResult` (what ``as_sink`` accepts).
SinkSpec = Union[str, "Sink", Callable[["FrameResult"], object]]

#: A JSON-like record the pipeline hands out: the run's summary (what ``edgert run --json`` prints), a source's
#: ``info()``, a processor's ``describe()``. Its values really are arbitrary JSON; its callers read them by key
#: and know what each key holds (the summary's keys are documented), so they are not ``object`` (a cast per read).
JSONDict = Dict[str, Any]


class PipelineSource(Protocol):
    """What the pipeline reads of every source (a context manager that opens it)."""

    @property
    def uri(self) -> str:
        """What logs, summaries and sinks show (credentials redacted)."""

    @property
    def live(self) -> bool:
        """A camera or stream (it drops stale frames), not a file."""

    @property
    def width(self) -> int:
        """Frame width in pixels; 0 while it is not known (audio: 0)."""

    @property
    def height(self) -> int: ...

    @property
    def fps(self) -> float | None:
        """Nominal frames per second; None when the source has none."""

    @property
    def dropped(self) -> int:
        """Stale live frames replaced before the pipeline took them."""

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        """The next frame (in ``out`` when its shape fits), or None at the end."""

    def stop(self) -> None:
        """Make a blocked ``read()`` return None soon (from another thread)."""

    def close(self) -> None: ...

    def info(self) -> JSONDict:
        """JSON-like facts for the summary and observers (uri, kind, live, width, height, fps, ...)."""

    def __enter__(self) -> object: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...
