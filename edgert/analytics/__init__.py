"""Tracking and analytics over detections: track ids, counting lines, zones (the pipeline's result stages).

``make_result_stages(config)`` gives the stages a pipeline config asks for; the pipeline runs them on its
result thread, in frame order, between decoding and the sinks (see :mod:`edgert.analytics.stages`).
"""

from __future__ import annotations

from edgert.analytics.analytics import Analytics
from edgert.analytics.lines import LineCounter
from edgert.analytics.stages import ResultStage, make_result_stages, run_stages, stages_summary
from edgert.analytics.tracking import Tracker
from edgert.analytics.zones import ZoneMonitor

__all__ = ["Analytics", "LineCounter", "ResultStage", "Tracker", "ZoneMonitor", "make_result_stages",
           "run_stages", "stages_summary"]
