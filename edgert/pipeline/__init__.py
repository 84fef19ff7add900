"""The streaming pipeline: stages on threads joined by bounded queues, with live statistics.

    from edgert.pipeline import Pipeline
    summary = Pipeline(config, observers=[MyObserver()]).run()
"""

from __future__ import annotations

from edgert.pipeline.observer import BaseObserver, PipelineObserver
from edgert.pipeline.runner import Pipeline, run_pipeline
from edgert.pipeline.stats import STAGES, PipelineStats

__all__ = ["STAGES", "BaseObserver", "Pipeline", "PipelineObserver", "PipelineStats", "run_pipeline"]
