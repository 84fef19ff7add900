"""What the pipeline's steps share during one run: :class:`RunState`.

The runner (:mod:`edgert.pipeline.runner`) only moves frames between threads; the steps beside it (opening the
sinks, each frame's last step, the signal handlers) need part of its state. They get it here, as one
:class:`RunState` the :class:`~edgert.pipeline.runner.Pipeline` owns (``Pipeline.state``), with public names, so
no step reads the runner's private attributes and no step imports the runner (which would be a circle: the
runner calls the steps). This module is low: it imports the config, the statistics, the processor's interface,
the sink worker and the feeds (for types), never a step or the runner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgert.analytics.workers import TrackingWorkers
    from edgert.config import PipelineConfig
    from edgert.io.sinks import SinkWorker
    from edgert.pipeline.feeds import _Feed
    from edgert.pipeline.observer import PipelineObserver
    from edgert.pipeline.parts import SinkSpec
    from edgert.pipeline.processor import Processor
    from edgert.stats import PipelineStats

__all__ = ["RunState"]


@dataclass(eq=False)
class RunState:
    """One pipeline's run as its steps see it; the :class:`~edgert.pipeline.runner.Pipeline` makes it and fills it.

    The three callables are the pipeline's own (:meth:`~edgert.pipeline.runner.Pipeline.request_stop`,
    :meth:`~edgert.pipeline.runner.Pipeline.abort`, and telling the observers ``notify(method, arg)``); the two
    events are set by them: ``stopping`` (admit no more frames) and ``aborting`` (drop what is in flight).
    """

    config: PipelineConfig
    stats: PipelineStats
    sink_specs: list[SinkSpec]
    request_stop: Callable[[str], None]
    abort: Callable[[str], None]
    notify: Callable[[str, object], None]
    stopping: threading.Event = field(default_factory=threading.Event)
    aborting: threading.Event = field(default_factory=threading.Event)
    #: every source of the run, in order (:mod:`edgert.pipeline.feeds`)
    feeds: list[_Feed] = field(default_factory=list)
    #: every sink worker (shared and per source), for closing and the summary
    workers: list[SinkWorker] = field(default_factory=list)
    #: the sink workers that get every source's frames
    shared: list[SinkWorker] = field(default_factory=list)
    #: what failed (a stage, a sink): the first is what ``run()`` raises
    errors: list[BaseException] = field(default_factory=list)
    #: detections per class id, over the run
    class_counts: dict[int, int] = field(default_factory=dict)
    names: tuple[str, ...] = ()  # the model's class names
    processor: Processor | None = None  # None until the run opened it (or one was given)
    #: what observers' ``on_start`` gets (task, model, backend, input, sources, sinks, the live stats, ...)
    info: dict[str, object] = field(default_factory=dict)
    started: bool = False  # ``on_start`` was told (after the first frame went through every stage)
    #: a sink has opened (truncated) its output: from then on a stop finalises the outputs
    outputs_open: bool = False
    #: the processes that track groups of sources (``track.workers``); None: tracking runs on the results thread
    tracking: TrackingWorkers | None = None
    #: the run's observers (the pipeline's own list: ``notify`` removes one that fails from it), for the results
    #: thread to tell those with ``on_frames`` once per batch (:mod:`edgert.pipeline.observer`)
    observers: list[PipelineObserver] = field(default_factory=list)
