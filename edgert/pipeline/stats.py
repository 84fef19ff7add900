"""The pipeline's live statistics; they live in :mod:`edgert.stats` so that sinks and the web preview
(below the pipeline) can read them. This module keeps the old import path working."""

from __future__ import annotations

from edgert.stats import STAGES, WINDOW, LatencyRing, PipelineStats, merged_quantiles_ms

__all__ = ["STAGES", "WINDOW", "LatencyRing", "PipelineStats", "merged_quantiles_ms"]
