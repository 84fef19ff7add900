"""The one streaming pipeline and its processors.

    from edgert.pipeline import Pipeline
    summary = Pipeline(config, observers=[MyObserver()]).run()

``runtime.processing`` picks the processor (``cpu`` or ``gpu``; ``auto``: the GPU one whenever the backend
runs on a GPU); everything else (admission, power budget, signals, observers, sinks, statistics, the summary)
is the same for both.
"""

from __future__ import annotations

from edgert.pipeline.observer import BaseObserver, PipelineObserver
from edgert.pipeline.runner import Pipeline
from edgert.stats import STAGES, PipelineStats

__all__ = ["STAGES", "BaseObserver", "Pipeline", "PipelineObserver", "PipelineStats"]
