"""Frame capture out of the interpreter's way: each source decoded in its own process into a shared ring.

``source.capture`` chooses how a source is read:

- ``thread``: in the pipeline's process, on its capture thread (one per source), as before;
- ``process``: in a worker process per source (:mod:`.process`), which decodes into a ring of frame slots in
  shared memory (:mod:`.ring`) that the pipeline reads in place; on the GPU processor the ring is registered
  with CUDA (page-locked: one DMA per frame; mapped, so zero-copy, on Jetson);
- ``auto`` (the default): ``process`` when the run has at least :data:`PROCESS_MIN_SOURCES` sources and the
  host at least :data:`PROCESS_MIN_CPUS` cores, else ``thread``.

Why that default: a worker takes the decoder (its FFmpeg or GStreamer threads, its driver calls) and every
per-frame step of reading out of the pipeline's process, which is left with one small message per frame; and a
decoder that crashes or hangs takes only its own source down (the run reports that source's failure and goes
on), where in-process it can take the whole run. On the H200 (docs/pipeline.md) workers and capture
threads ran at the same rate within the run-to-run spread (-6 % to +4 % at 8-32 streams), so the default is set
by the isolation and by what a worker costs: a process per source (about 0.5 s to start, all sources' workers
at once; a Python with NumPy and OpenCV in memory each) and a pipe hop per frame. One source, or a host of
fewer than 4 cores (a worker per source would only add context switches there), stays ``thread``. Jetsons
(Orin Nano: 6 cores, AGX Orin: 12) get the same rule; there a worker decodes a video file with the hardware
decoder (:mod:`.jetson`; written for JetPack, not run here). Preloaded sources are in memory already and always
stay ``thread``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgert.config import SourceConfig
    from edgert.io.sources import FrameSource

__all__ = ["CAPTURE_MODES", "PROCESS_MIN_CPUS", "PROCESS_MIN_SOURCES", "choose_capture", "open_captured"]

CAPTURE_MODES = ("auto", "thread", "process")
PROCESS_MIN_SOURCES = 4
PROCESS_MIN_CPUS = 4


def choose_capture(requested: str, sources: int, cpus: int | None = None, preload: bool = False) -> str:
    """``"thread"`` or ``"process"`` for ``requested`` (one of :data:`CAPTURE_MODES`) in a run of ``sources``."""
    from edgert.errors import ConfigError

    if requested not in CAPTURE_MODES:
        raise ConfigError(f"source.capture: {requested!r} is not one of {', '.join(CAPTURE_MODES)}")
    if preload:
        if requested == "process":
            raise ConfigError("source.capture: process cannot apply to a preloaded source (its frames are in "
                              "memory already). Note: drop --preload or --capture process")
        return "thread"
    if requested != "auto":
        return requested
    if cpus is None:
        cpus = os.cpu_count() or 1
    return "process" if sources >= PROCESS_MIN_SOURCES and cpus >= PROCESS_MIN_CPUS else "thread"


def open_captured(config: SourceConfig, sources: int) -> FrameSource:
    """The source for ``config`` (a SourceConfig) read as ``choose_capture`` says, not yet opened."""
    mode = choose_capture(getattr(config, "capture", "auto") or "auto", sources, preload=bool(config.preload))
    if mode == "process":
        from edgert.io.capture.process import ProcessCaptureSource

        return ProcessCaptureSource(config)
    from edgert.io.sources import open_source

    return open_source(config, among=sources)
