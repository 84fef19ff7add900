"""What every frame source shares: the :class:`FrameSource` interface, skip reasons, stall timeouts,
the once-then-counted :class:`RepeatedWarning`, media time, and the small helpers the sources use."""

from __future__ import annotations

import abc
import logging
from types import TracebackType
from typing import Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.redact import redact

#: One logger for every source module: the name users and tests filter on stays "edgert.io.sources".
log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".pgm", ".ppm"})

#: Reasons a file source skips frames (keys of ``FrameSource.skipped_by_reason``).
SKIP_UNDECODABLE = "undecodable_frame"  # a frame inside the video failed to decode; later ones did
SKIP_DAMAGED_END = "damaged_end"  # frames the container lists after the point where decoding stopped for good
SKIP_UNREADABLE_IMAGE = "unreadable_image"  # an image file of a folder or glob that does not decode
SKIP_LARGE_IMAGE = "image_too_large"  # an image file whose header gives more pixels than the decode budget


class RepeatedWarning:
    """A warning that may happen many times: logged the first time, counted after, summed up at the end.

    A damaged video or a folder of broken images would otherwise print the same line for every frame.
    """

    def __init__(self, logger: logging.Logger, message: str) -> None:
        self.logger = logger
        self.message = message  # %-format with the first occurrence's arguments
        self.count = 0

    def __call__(self, *args: Any) -> None:
        self.count += 1
        if self.count == 1:
            self.logger.warning(self.message + " (further ones are counted, not logged)", *args)
        else:
            self.logger.debug(self.message, *args)

    def summary(self, what: str) -> None:
        """Log the total once (when there were more than one), then start counting afresh."""
        if self.count > 1:
            self.logger.warning("%s: %d in all", what, self.count)
        self.count = 0


#: Seconds without a frame after which a source has stalled (``source.timeout_s`` overrides both).
FILE_TIMEOUT_S = 10.0
LIVE_TIMEOUT_S = 5.0


def _cv2() -> Any:
    return lazy_import("cv2", "video and camera sources")



# --------------------------------------------------------------------------------------------------
# The interface


class FrameSource(abc.ABC):
    """A source of BGR frames. Use as a context manager; ``read()`` returns None at the end."""

    live: bool = False
    kind: str = "?"

    def __init__(self, uri: str) -> None:
        self.uri = redact(uri)  # what logs, summaries and sinks show; openers keep the real URI to themselves
        self.width = 0
        self.height = 0
        self.fps: float | None = None  # nominal frames per second; None when the source has none
        self.dropped = 0  # live sources: stale frames replaced before the pipeline took them
        self.skipped = 0  # frames that could not be decoded (all reasons)
        self.skipped_by_reason: dict[str, int] = {}  # the same by reason (SKIP_* above)
        self.reconnects = 0
        #: Why ``read()`` returned None: "end of input" at a normal end, else what cut the input short
        #: (a damaged video, a stall: "stalled: ...", a stop: "stopped"). None while the source still delivers.
        self.end_reason: str | None = None
        #: Whether the input ended before its end (damage): ``end_reason`` then says why.
        self.ended_early = False
        self.stalls = 0  # times no frame came within the read timeout
        #: Media time (seconds) of the frame ``read()`` last returned, on the source's own clock (a file's
        #: timestamps, a live source's capture clock); None: the source has none (the pipeline then counts
        #: frames at ``fps``). Analytics (dwell, track ages) run on it; :data:`time_base` says which it is.
        self.frame_time: float | None = None
        self._opened = False

    #: What ``frame_time`` is, for summaries: "media" (a file's own timestamps, or frame index / fps) or
    #: "capture clock" (live sources: when the frame arrived, on a monotonic clock: edgert.io.capture_clock).
    time_base: str = "media"

    @abc.abstractmethod
    def open(self) -> None:
        """Open the source; raise :class:`SourceError` (one line) when it cannot be."""

    @abc.abstractmethod
    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        """The next frame (in ``out`` when its shape fits), or None when the source has ended."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Make a blocked ``read()`` return None soon (called from another thread)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def expected_frames(self) -> int | None:
        """How many frames ``read()`` will deliver, when known ahead (a file or a folder, not looped); None
        otherwise. For a progress bar's total: a damaged file may end sooner."""
        return None

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"uri": self.uri, "kind": self.kind, "live": self.live, "width": self.width,
                                "height": self.height, "fps": self.fps, "stalls": self.stalls}
        if self.end_reason is not None:
            info["end_reason"] = self.end_reason
        return info

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` frames skipped for ``reason``."""
        if count > 0:
            self.skipped += count
            self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + count

    def counters(self) -> dict[str, Any]:
        """What the source counted, for summaries: skips by reason, drops, reconnects, why it ended."""
        return {"skipped": dict(self.skipped_by_reason), "dropped": self.dropped, "reconnects": self.reconnects,
                "end_reason": self.end_reason, "ended_early": self.ended_early}

    def __enter__(self) -> FrameSource:
        if not self._opened:
            self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def media_time(source: Any, index: int, clock: float) -> float:
    """Media time of frame ``index`` (the pipeline's count) just read from ``source``: the source's own
    ``frame_time``; else, for a file, ``index / fps`` (30 when it has no rate), for a live source ``clock``.
    Any object with ``read()`` may be a source; one without these attributes is judged by ``live``."""
    t = getattr(source, "frame_time", None)
    if t is not None:
        return float(t)
    if getattr(source, "live", False):
        return clock
    return index / float(getattr(source, "fps", None) or 30.0)


def time_base(source: Any) -> str:
    """What :func:`media_time` is for ``source``, as summaries say it: "media" or "capture clock"."""
    if getattr(source, "live", False):
        return "capture clock"
    return str(getattr(source, "time_base", None) or "media")


def _into(out: np.ndarray | None, frame: np.ndarray) -> np.ndarray:
    """``frame`` copied into ``out`` when the shapes agree, else ``frame`` itself."""
    if out is not None and out.shape == frame.shape and out.dtype == frame.dtype:
        np.copyto(out, frame)
        return out
    return frame
