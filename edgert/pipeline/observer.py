"""Hooks into a running pipeline, for things that watch it (systemd watchdog, power meter, metrics).

An observer is any object with the three methods of :class:`PipelineObserver`. The pipeline calls them
from its own threads, so they must be quick and must not raise: an exception from an observer is logged
and the observer is dropped, the pipeline keeps running.

- ``on_start(info)``: once, after the model is loaded and the FIRST frame has gone through every stage
  (a service is "ready" only then). ``info`` holds task, model, backend, source (URI) and source_info,
  sinks, input name/shape/dtype, and ``stats``: the live :class:`PipelineStats` of this run.
- ``on_frame(stats)``: after each completed frame, driven by the pipeline's progress (not a timer), so a
  watchdog pinged from here stops being pinged when the pipeline stalls.
- ``on_stop(summary)``: once, when the run ends (end of input, stop request or error); ``summary`` is
  the same dict ``edgert run --json`` prints.

Optional, for observers that need no call per frame: ``on_frames(stats)``, once per batch of completed frames
(``stats.frames`` says how many in all; the observer keeps the count it saw last). When every observer of a run
has it, the results thread calls it once per batch and ``on_frame`` not at all, and counts the batch's frames
without a Python call per frame and observer (at 16 cameras a batch is 16 frames, and each call holds
the interpreter lock beside the threads that feed the engine). One observer without it, and every observer gets
``on_frame`` per frame as before: ``stats.frames`` then steps by one between calls, which tests like
``stats.frames % n == 1`` need. A :class:`BaseObserver` subclass that leaves ``on_frame`` alone (it only
announces the start, say) needs no frame at all and does not force the per-frame calls
(:func:`needs_every_frame`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from edgert.stats import PipelineStats

if TYPE_CHECKING:
    from edgert.pipeline.parts import JSONDict

__all__ = ["BaseObserver", "PipelineObserver", "needs_every_frame"]


@runtime_checkable
class PipelineObserver(Protocol):
    def on_start(self, info: JSONDict) -> None: ...

    def on_frame(self, stats: PipelineStats) -> None: ...

    def on_stop(self, summary: JSONDict) -> None: ...


class BaseObserver:
    """An observer that does nothing: subclass it and override what you need."""

    def on_start(self, info: JSONDict) -> None:
        """The model is loaded and the first frame is through."""

    def on_frame(self, stats: PipelineStats) -> None:
        """A frame has completed (called from the pipeline's progress, never from a timer)."""

    def on_frames(self, stats: PipelineStats) -> None:
        """Frames have completed, ``stats.frames`` in all (once per batch, when no observer of the run
        :func:`needs_every_frame`); nothing here: a subclass that overrides only :meth:`on_frame` is called per
        frame instead."""

    def on_stop_requested(self, reason: str) -> None:
        """Optional: a stop was asked for (SIGTERM, max frames); frames in flight still finish."""

    def on_stop(self, summary: JSONDict) -> None:
        """The run has ended and the sinks are flushed."""


def needs_every_frame(observer: object) -> bool:
    """Whether ``observer`` must see each frame's count (``on_frame``): it has no ``on_frames``, or it is a
    :class:`BaseObserver` that overrides ``on_frame`` and not ``on_frames`` (so BaseObserver's empty one is not
    taken as "batches are fine" for an observer written before batches existed)."""
    kind = type(observer)
    batches = getattr(kind, "on_frames", None)
    if batches is None:
        return True
    return batches is BaseObserver.on_frames and getattr(kind, "on_frame", None) is not BaseObserver.on_frame
