"""``source.preload``: decode a whole file source into memory before the clock starts.

For benchmarks that measure the engine and the pipeline, not the CPU's video decoder (on a fast GPU a
single decoding thread is what limits a run). Each ``read`` copies the next stored frame into the
pipeline's frame buffer, so drawing never touches the stored frames and a looped run stays correct.
Live sources are refused: they cannot be read ahead.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from edgert.errors import ConfigError

if TYPE_CHECKING:
    from edgert.io.sources import FrameSource
    from edgert.pipeline.parts import JSONDict

__all__ = ["PreloadedSource"]


class PreloadedSource:
    """Wraps an opened-on-enter file source; at most ``limit`` frames are kept (None: all)."""

    live = False

    def __init__(self, source: FrameSource, limit: int | None = None, loop: bool = False) -> None:
        if getattr(source, "live", False):
            raise ConfigError(f"source.preload (--preload): {source.uri} is a live source; only files can be "
                              "read ahead")
        self._inner = source
        self._limit = limit
        self._loop = loop
        self._frames: list[np.ndarray] = []
        self._times: list[float | None] = []  # each stored frame's media time (the file's own)
        self._pass_s = 0.0  # media time added per loop: the stored frames' span plus one frame
        self._passes = 0
        self._next = 0
        self.frame_time: float | None = None
        self._stopped = False

    def __getattr__(self, name: str) -> Any:  # uri, width, height, fps, skipped, reconnects, ...
        return getattr(self._inner, name)

    def __enter__(self) -> PreloadedSource:
        self._inner.__enter__()
        while self._limit is None or len(self._frames) < self._limit:
            frame = self._inner.read()
            if frame is None:
                break
            self._frames.append(frame.copy())
            self._times.append(getattr(self._inner, "frame_time", None))
        known = [t for t in self._times if t is not None]
        if known:
            self._pass_s = known[-1] + 1.0 / float(getattr(self._inner, "fps", None) or 30.0)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._frames, self._times = [], []
        self._inner.__exit__(exc_type, exc, tb)

    @property
    def dropped(self) -> int:
        return 0

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        if self._stopped or not self._frames:
            return None
        if self._next >= len(self._frames):
            if not self._loop:
                return None
            self._next = 0
            self._passes += 1
        frame = self._frames[self._next]
        t = self._times[self._next]
        self.frame_time = None if t is None else t + self._passes * self._pass_s
        self._next += 1
        if out is not None and out.shape == frame.shape and out.dtype == frame.dtype:
            np.copyto(out, frame)
            return out
        return frame.copy()

    def stop(self) -> None:
        self._stopped = True

    def info(self) -> JSONDict:
        info = self._inner.info()
        info["preloaded"] = len(self._frames)
        return info
