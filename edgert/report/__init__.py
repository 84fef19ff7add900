"""Pictures of edgert's work: self-contained HTML pages with SVG charts (no plotting library, no network).

- :mod:`.series`: ``SeriesRecorder``, a pipeline observer keeping a bounded time series.
- :mod:`.svg`: the charts (lines, points, bars, reference lines) as SVG text.
- :mod:`.page`: the HTML document, tables, atomic writes.
- :mod:`.html`: the run report (``edgert run --report``): ``attach_report``, ``ReportObserver``.
- :mod:`.bench`: the ``edgert bench --report`` page.
- :mod:`.calib`: the calibration report's page (per-tensor ranges, per-layer sensitivity).

Nothing is imported here, so the calibration and bench pages do not pull in the pipeline.
"""

from __future__ import annotations
