"""The ``edgert bench --report bench.html`` page: the figures of one or more bench runs as charts.

One run per setting (a backend, or each precision of ``--precisions``): latency percentiles and
throughput side by side, the GPU copy/compute split when there is one, watts and millijoules per frame
when a power meter ran; then, per setting, the latency of every timed iteration (binned to at most
:data:`MAX_POINTS` points, with each bin's maximum so a stall still shows), its histogram, and the
watts sampled during the loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgert.report.page import escape, page, table
from edgert.report.svg import PALETTE, Plot, fmt

__all__ = ["MAX_POINTS", "bench_report", "setting_name", "setting_names"]

#: Most points drawn for one latency trace; longer runs are averaged in bins.
MAX_POINTS = 1000

_PERCENTILES = ("mean", "p50", "p90", "p95", "p99")  # max is in the table: one stall would flatten the rest


def setting_name(result: Mapping[str, Any]) -> str:
    """``onnxruntime``, ``tensorrt fp16``: what distinguishes one bench result from another."""
    return f"{result.get('backend')}" + (f" {result['precision']}" if result.get("precision") else "")


def setting_names(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """One distinct label per result: the setting, then the model's file name, then a number if needed."""
    names = [setting_name(r) for r in results]
    if len(set(names)) < len(names):
        names = [f"{n} {str(r.get('model') or '').replace(chr(92), '/').rsplit('/', 1)[-1]}".strip()
                 for n, r in zip(names, results)]
    if len(set(names)) < len(names):
        names = [f"{n} #{i + 1}" for i, n in enumerate(names)]
    return names


def _binned(values: Sequence[float], max_points: int = MAX_POINTS) -> tuple[list[float], list[float], list[float]]:
    """(x, mean, max) of ``values`` in at most ``max_points`` equal bins; x is the bin's middle iteration."""
    a = np.asarray(values, np.float64)
    if a.size <= max_points:
        return [float(i) for i in range(1, a.size + 1)], a.tolist(), a.tolist()
    edges = np.linspace(0, a.size, max_points + 1).astype(np.int64)
    mean = np.add.reduceat(a, edges[:-1]) / np.diff(edges)
    peak = np.maximum.reduceat(a, edges[:-1])
    middle = (edges[:-1] + edges[1:]) / 2.0
    return middle.tolist(), mean.tolist(), peak.tolist()


def _width(categories: int) -> int:
    """Chart width for a bar chart: narrow for one or two bars, so a single setting is not a wall."""
    return max(360, min(760, 140 + 130 * categories))


def _histogram(values: Sequence[float], bins: int = 50) -> tuple[list[float], list[float], float]:
    a = np.asarray(values, np.float64)
    # Up to p99, or 5 x p50 when the tail is longer than that (a loaded machine's stalls): the far tail
    # would squash the shape of everything else into one bar.
    hi = min(float(np.percentile(a, 99)), 5 * float(np.percentile(a, 50))) if a.size else 1.0
    lo = float(a.min()) if a.size else 0.0
    if hi <= lo:
        hi = lo + 1e-3
    counts, edges = np.histogram(np.clip(a, lo, hi), bins=bins, range=(lo, hi))
    centres = ((edges[:-1] + edges[1:]) / 2).tolist()
    return centres, counts.astype(np.float64).tolist(), float(edges[1] - edges[0])


def _comparison(results: Sequence[Mapping[str, Any]], names: list[str]) -> list[str]:
    parts: list[str] = []
    n = len(results)
    width = 0.8 / n

    lat = Plot("Latency percentiles per setting (session.infer, host copies included)", y_label="ms",
               x_labels=list(_PERCENTILES), chart_id="latency-percentiles",
               width=_width(len(_PERCENTILES) * n))
    for k, (name, r) in enumerate(zip(names, results)):
        q = r.get("latency_ms") or {}
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(_PERCENTILES))]
        lat.bars(name, xs, [q.get(p) for p in _PERCENTILES], PALETTE[k % len(PALETTE)], bar_width=width * 0.92,
                 labels=n <= 3)
    parts.append(lat.svg())

    fps = Plot("Throughput per setting", y_label="inferences / s", x_labels=names, chart_id="throughput",
               height=240, width=_width(n * (2 if _any_gpu(results) else 1)))
    fps.bars("end to end", [i - (0.2 if _any_gpu(results) else 0) for i in range(n)],
             [r.get("throughput_fps") for r in results], PALETTE[0], bar_width=0.4 if _any_gpu(results) else 0.6)
    if _any_gpu(results):
        fps.bars("compute only", [i + 0.2 for i in range(n)],
                 [(r.get("gpu") or {}).get("compute_only_fps") for r in results], PALETTE[1], bar_width=0.4)
    parts.append(fps.svg())

    if _any_gpu(results):
        split = Plot("GPU time per inference, p50 (CUDA events)", y_label="ms", x_labels=names, chart_id="gpu-split",
                     height=240, width=_width(3 * n))
        for k, key in enumerate(("h2d_ms", "compute_ms", "d2h_ms")):
            split.bars(key[:-3], [i - 0.3 + 0.2 * (k + 0.5) for i in range(n)],
                       [((r.get("gpu") or {}).get(key) or {}).get("p50") for r in results], PALETTE[k], bar_width=0.19)
        parts.append(split.svg())

    powers = [r.get("power") or {} for r in results]
    if any(p.get("avg_w") is not None for p in powers):
        watts = Plot("Power during the timed loop", y_label="W", x_labels=names, chart_id="power", height=240,
                     width=_width(2 * n))
        watts.bars("average", [i - 0.2 for i in range(n)], [p.get("avg_w") for p in powers], PALETTE[2],
                   bar_width=0.4)
        watts.bars("peak", [i + 0.2 for i in range(n)], [p.get("peak_w") for p in powers], PALETTE[5], bar_width=0.4)
        parts.append(watts.svg())
        if any(p.get("mj_per_frame") is not None for p in powers):
            mj = Plot("Energy per inference", y_label="mJ", x_labels=names, chart_id="energy", height=220,
                      width=_width(n))
            mj.bars("mJ per inference", list(range(n)), [p.get("mj_per_frame") for p in powers], PALETTE[3],
                    bar_width=0.5)
            parts.append(mj.svg())
    else:
        notes = {r.get("power_note") for r in results if r.get("power_note")}
        note = "; ".join(sorted(str(x) for x in notes)) or "run with --power to measure watts"
        parts.append(f'<p class="note">Watts not measured: {escape(note)}.</p>')
    return parts


def _any_gpu(results: Sequence[Mapping[str, Any]]) -> bool:
    return any(r.get("gpu") for r in results)


def _traces(name: str, color: str, trace: Mapping[str, Any]) -> list[str]:
    parts: list[str] = []
    lat = list(trace.get("latency_ms") or [])
    if lat:
        x, mean, peak = _binned(lat)
        binned = len(x) < len(lat)
        # Cut the y axis above the slowest 0.1 %: one 30 ms stall would otherwise flatten 0.05 ms iterations.
        cap = float(np.percentile(lat, 99.9)) * 1.3
        slower = sum(1 for v in lat if v > cap)
        notes = []
        if binned:
            notes.append(f"Mean and maximum of bins of {math.ceil(len(lat) / len(x))} iterations.")
        if slower:
            notes.append(f"The y axis is cut at {fmt(cap, 3)} ms: {slower} iterations were slower "
                         f"(max {fmt(max(lat), 3)} ms).")
        plot = Plot(f"{name}: latency of each timed iteration", x_label="iteration", y_label="ms", chart_id="trace",
                    y_range=(0.0, cap) if slower else None)
        if binned:
            plot.line("bin max", x, peak, "#bbbbbb", width=1.0)
        plot.line("latency" if not binned else "bin mean", x, mean, color)
        plot.hline(f"p50 {fmt(float(np.percentile(lat, 50)), 3)} ms", float(np.percentile(lat, 50)), "#666666")
        parts.append(plot.svg())
        if notes:
            parts.append(f'<p class="note">{escape(" ".join(notes))}</p>')
        centres, counts, step = _histogram(lat)
        hist = Plot(f"{name}: latency histogram (up to {fmt(centres[-1] + step / 2, 3)} ms; slower ones in the "
                    "last bar)", x_label="ms",
                    y_label="iterations", chart_id="histogram", height=220)
        hist.bars("iterations", centres, counts, color, bar_width=step * 0.95, labels=False, legend=False)
        parts.append(hist.svg())
    watts = list(trace.get("watts") or [])
    if watts:
        plot = Plot(f"{name}: power during the timed loop", x_label="time (s)", y_label="W", chart_id="trace-watts",
                    height=220)
        plot.line("watts", [t for t, _ in watts], [w for _, w in watts], PALETTE[2])
        parts.append(plot.svg())
    return parts


def _trace_data(trace: Mapping[str, Any]) -> dict[str, Any]:
    """What the page embeds of a trace: the binned latencies as drawn (a long run stays a small page)."""
    x, mean, peak = _binned(list(trace.get("latency_ms") or []))
    return {"iteration": x, "latency_ms": [round(v, 4) for v in mean], "latency_max_ms": [round(v, 4) for v in peak],
            "watts": [[round(t, 3), round(w, 3)] for t, w in (trace.get("watts") or [])]}


def bench_report(results: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The page for ``results`` (what ``edgert bench --json`` prints, one per setting) and, optionally,
    one trace per result: ``{"latency_ms": [per iteration], "watts": [(seconds, watts), ...]}``."""
    if not results:
        return page("edgert bench", '<p class="note">No results.</p>')
    names = setting_names(results)
    parts = _comparison(results, names)
    for k, (name, trace) in enumerate(zip(names, traces or [])):
        parts.append(f"<h2>{escape(name)}</h2>")
        parts += _traces(name, PALETTE[k % len(PALETTE)], trace)
    parts.append("<h2>Results</h2>")
    for name, r in zip(names, results):
        if len(results) > 1:
            parts.append(f"<h3>{escape(name)}</h3>")
        parts.append(table(r))
    models = dict.fromkeys(str(r.get("model") or "model").replace("\\", "/").rsplit("/", 1)[-1] for r in results)
    model = ", ".join(models)
    first = results[0]
    subtitle = f"{first.get('iterations')} timed iterations" + (f" per setting, {len(results)} settings"
                                                                if len(results) > 1 else "")
    data = {"results": results, "traces": [_trace_data(t) for t in (traces or [])]}
    return page(f"edgert bench: {model}", "\n".join(parts), subtitle=subtitle, data=data)
