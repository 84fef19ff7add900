"""The run report: ``edgert run --report run.html``.

:func:`attach_report` adds a :class:`ReportObserver` (a :class:`~edgert.report.series.SeriesRecorder`)
to a pipeline's observers; when the run ends, its ``on_stop`` writes one self-contained page
(:mod:`edgert.report.page`) with FPS (and, with several sources, FPS and drops per source), per-stage
latency p50/p99, watts (with the power budget line) and drops over time, and the run's summary as a table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgert.errors import ReportError
from edgert.report.page import check_writable, page, table, write_page
from edgert.report.series import SeriesRecorder
from edgert.report.svg import PALETTE, Plot, fmt
from edgert.stats import STAGES

__all__ = ["STAGE_COLORS", "ReportObserver", "attach_report", "run_report"]

#: One colour per pipeline stage, the same in every chart; ``total`` is black.
STAGE_COLORS: dict[str, str] = dict(zip(STAGES, PALETTE))
STAGE_COLORS["total"] = "#000000"


# --------------------------------------------------------------------------------------------------
# Run report


def _time_axis(t: Sequence[float]) -> tuple[list[float], str]:
    """Seconds, or minutes / hours for long runs, so the ticks stay readable."""
    end = max(t) if t else 0.0
    if end > 3 * 3600:
        return [v / 3600 for v in t], "time since start (h)"
    if end > 1200:
        return [v / 60 for v in t], "time since start (min)"
    return list(t), "time since start (s)"


def _has_values(values: Sequence[float | None]) -> bool:
    return any(v is not None for v in values)


def run_report(series: Mapping[str, Any], summary: Mapping[str, Any], *, budget_w: float | None = None,
               rail: str | None = None, title: str | None = None) -> str:
    """The run page: charts of ``series`` (:meth:`SeriesRecorder.to_dict`) and ``summary`` as a table."""
    x, x_label = _time_axis(series.get("t", []))
    x_range = (0.0, max(x)) if x else None  # time from the start of the run
    parts: list[str] = []
    points = int(series.get("points", len(x)))
    interval = float(series.get("interval_s", 1.0))
    parts.append(f'<p class="note">{points} points, one per {fmt(interval)} s of the run'
                 + (" (merged as the run grew long)" if series.get("merges") else "") + ".</p>")
    if points == 0:
        parts.append('<p class="note">No data over time: the run ended before the first interval.</p>')

    fps = Plot("Frames per second", x_label=x_label, y_label="FPS", chart_id="fps", x_range=x_range)
    fps.line("fps", x, series.get("fps", []), PALETTE[0], width=2.2)
    avg = summary.get("fps")
    if isinstance(avg, (int, float)) and avg > 0:
        fps.hline(f"average {fmt(float(avg), 3)} fps", float(avg), "#666666")
    parts.append(fps.svg())

    parts.extend(_per_source(series, x, x_label, x_range))

    latency = series.get("latency_ms", {})
    for q, name in (("p50", "median"), ("p99", "99th percentile")):
        plot = Plot(f"Latency per stage, {name} ({q}) of each interval", x_label=x_label, y_label="ms",
                    chart_id=f"latency-{q}", x_range=x_range)
        for stage in STAGES:
            values = latency.get(stage, {}).get(q, [])
            if _has_values(values):
                plot.line(stage, x, values, STAGE_COLORS[stage], width=2.4 if stage == "total" else 1.6)
        parts.append(plot.svg())

    rtf = series.get("rtf", [])
    if _has_values(rtf):  # a speech run: processing seconds per second of audio, under 1 keeps up
        plot = Plot("Real-time factor of the speech chain (busy s per audio s)", x_label=x_label, y_label="RTF",
                    chart_id="rtf", x_range=x_range)
        plot.line("rtf", x, rtf, PALETTE[1], width=2.2)
        plot.hline("real time", 1.0, "#D55E00")
        parts.append(plot.svg())

    watts = series.get("watts", [])
    if _has_values(watts) or budget_w is not None:
        label = f"Power ({rail})" if rail else "Power"
        plot = Plot(label, x_label=x_label, y_label="W", chart_id="watts", x_range=x_range)
        if _has_values(watts):
            plot.line("watts", x, watts, PALETTE[2], width=2.2)
        if budget_w is not None:
            plot.hline(f"budget {fmt(budget_w)} W", budget_w, "#D55E00")
        parts.append(plot.svg())
        if not _has_values(watts):
            parts.append('<p class="note">No watts measured during this run (no power meter read).</p>')
    else:
        parts.append('<p class="note">No power meter on this machine: watts were not measured.</p>')

    temps = series.get("temperature_c", [])
    if _has_values(temps):  # board telemetry (edgert.power.telemetry): shown only where the board has zones
        plot = Plot("Hottest thermal zone", x_label=x_label, y_label="C", chart_id="temperature", x_range=x_range)
        plot.line("max zone", x, temps, PALETTE[1], width=2.0)
        parts.append(plot.svg())

    dropped = series.get("dropped", [])
    if dropped and max(dropped) > 0:
        plot = Plot("Dropped frames (cumulative)", x_label=x_label, y_label="frames", chart_id="dropped",
                    x_range=x_range)
        plot.line("dropped", x, dropped, PALETTE[5])
        parts.append(plot.svg())

    parts.append("<h2>Summary</h2>")
    parts.append(table(summary))
    src = summary.get("source") or {}
    uri = src.get("uri") if isinstance(src, Mapping) else None
    model = str(summary.get("model") or "model").replace("\\", "/").rsplit("/", 1)[-1]
    heading = title or f"edgert run: {model}" + (f" on {uri}" if uri else "")
    backend = summary.get("backend")
    return page(heading, "\n".join(parts), subtitle=f"backend {backend}" if backend else "",
                data={"series": series, "summary": summary, "budget_w": budget_w})


def _per_source(series: Mapping[str, Any], x: list[float], x_label: str,
                x_range: tuple[float, float] | None) -> list[str]:
    """With several sources: each one's FPS over time, and its drops when it had any."""
    sources = series.get("sources") or {}
    if len(sources) < 2:
        return []
    parts = []
    plot = Plot("Frames per second, per source", x_label=x_label, y_label="FPS", chart_id="fps-per-source",
                x_range=x_range)
    for k, (name, points) in enumerate(sorted(sources.items())):
        plot.line(f"source {name}", x, points.get("fps", []), PALETTE[k % len(PALETTE)], width=1.8)
    parts.append(plot.svg())
    if any(max(points.get("dropped") or [0]) > 0 for points in sources.values()):
        drops = Plot("Dropped frames per source (cumulative)", x_label=x_label, y_label="frames",
                     chart_id="dropped-per-source", x_range=x_range)
        for k, (name, points) in enumerate(sorted(sources.items())):
            drops.line(f"source {name}", x, points.get("dropped", []), PALETTE[k % len(PALETTE)])
        parts.append(drops.svg())
    parts.append('<p class="note">Per source: each source\'s own frames over each interval (its figures are '
                 "refreshed every 10 of its frames); the counts of lines and zones per source are in the "
                 "summary's <code>counts</code> and <code>sources</code>.</p>")
    return parts


class ReportObserver(SeriesRecorder):
    """Records the run's time series; at ``on_stop`` writes the run report to ``path``.

    ``error`` holds the :class:`~edgert.errors.ReportError` if the page could not be written (the
    exception is raised too, so the pipeline logs it; the run itself is not affected).
    """

    def __init__(self, path: str | Path, budget_w: float | None = None, rail: str | None = None,
                 interval_s: float = 1.0, max_points: int = 1024) -> None:
        super().__init__(interval_s=interval_s, max_points=max_points)
        self.path = Path(path)
        self.budget_w = budget_w
        self.rail = rail
        self.written: Path | None = None
        self.error: ReportError | None = None

    def on_stop(self, summary: dict[str, Any]) -> None:
        super().on_stop(summary)
        self.write(summary)

    def write(self, summary: Mapping[str, Any]) -> Path:
        """Write (or rewrite, e.g. with a power summary added) the page for ``summary`` now."""
        try:
            self.written = write_page(self.path, run_report(self.to_dict(), summary, budget_w=self.budget_w,
                                                            rail=self.rail))
        except ReportError as exc:
            self.error = exc
            raise
        return self.written


def attach_report(observers: list[Any], path: str | Path, budget_w: float | None = None,
                  rail: str | None = None) -> ReportObserver:
    """Check that ``path`` can be written, append a :class:`ReportObserver` to ``observers``, return it."""
    observer = ReportObserver(check_writable(path), budget_w=budget_w, rail=rail)
    observers.append(observer)
    return observer
