"""Plain SVG charts written as text: axes with round-number ticks, lines, points, bars, reference lines.

No plotting library: a report must open on a Jetson without network or extra packages, so each chart
is an ``<svg>`` element inlined in the page. Every plotted series carries ``data-series`` (and bars
``data-value``) so a browser test can find the data it drew; a ``<title>`` on each mark is its tooltip.
Values that are ``None`` or NaN are gaps: a line is broken there rather than drawn through zero.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["PALETTE", "Plot", "fmt", "hbar_chart", "nice_ticks"]

#: Okabe-Ito colours (readable with the common colour-vision deficiencies), then greys.
PALETTE: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000",
                            "#F0E442", "#999999")

_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 20, 52, 44
_LEGEND_Y = 38
_CLIP_IDS = itertools.count(1)


def fmt(value: float, digits: int = 4) -> str:
    """A short label for a number: ``1.5``, ``2e+03`` becomes ``2000``, ``0.000123``."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    if 1e-3 <= abs(value) < 1e6:
        text = f"{value:.{digits}g}"
        if "e" in text:  # .4g of 12345 is 1.234e+04: print the integer instead
            text = str(round(value))
        return text
    return f"{value:.2g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round-number ticks covering [lo, hi] (the first <= lo, the last >= hi), about ``count`` steps."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-9))
    first = math.floor(lo / step + 1e-9) * step
    ticks = [first]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(first + len(ticks) * step)
    return [round(t, 12) for t in ticks]


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


@dataclass
class _Mark:
    kind: str  # line, points, bars, segments, hline
    name: str
    color: str
    xs: list[float]
    ys: list[float | None]
    highs: list[float | None] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    dashed: bool = False
    size: float = 1.8  # line width, point radius or bar width
    labels: bool = False


class Plot:
    """One chart: x and y axes over fixed ranges, then marks added in data coordinates.

    ``x_range``/``y_range`` are (low, high); give None for either to fit the data added before
    :meth:`svg` is called (y then starts at 0 unless ``y_zero=False``). ``log_y`` plots y on a
    base-10 log scale (values <= 0 are gaps). ``x_labels`` replaces numeric x ticks by category names
    at x = 0, 1, 2, ...
    """

    def __init__(self, title: str, *, x_label: str = "", y_label: str = "", width: int = 760, height: int = 280,
                 x_range: tuple[float, float] | None = None, y_range: tuple[float, float] | None = None,
                 y_zero: bool = True, log_y: bool = False, x_labels: Sequence[str] | None = None,
                 chart_id: str = "") -> None:
        self.title = title
        self.x_label, self.y_label = x_label, y_label
        self.width, self.height = width, height
        self.x_range, self.y_range = x_range, y_range
        self.y_zero, self.log_y = y_zero, log_y
        self.x_labels = list(x_labels) if x_labels is not None else None
        self.chart_id = chart_id
        self._marks: list[_Mark] = []
        self._legend: list[tuple[str, str, bool]] = []
        self._xs: list[float] = []
        self._ys: list[float] = []

    # -- marks (data coordinates) -------------------------------------------------------------------
    def line(self, name: str, xs: Sequence[float], ys: Sequence[float | None], color: str, *,
             dashed: bool = False, width: float = 1.8, legend: bool = True) -> None:
        """A polyline, broken at gaps; one ``<polyline data-series=name>`` per unbroken run."""
        self._add(_Mark("line", name, color, list(xs), list(ys), dashed=dashed, size=width), legend)

    def points(self, name: str, xs: Sequence[float], ys: Sequence[float | None], color: str, *,
               titles: Sequence[str] | None = None, radius: float = 3.0, legend: bool = True) -> None:
        self._add(_Mark("points", name, color, list(xs), list(ys), titles=list(titles or []), size=radius), legend)

    def bars(self, name: str, xs: Sequence[float], ys: Sequence[float | None], color: str, *, bar_width: float = 0.8,
             titles: Sequence[str] | None = None, labels: bool = True, legend: bool = True) -> None:
        """Vertical bars centred on ``xs``, ``bar_width`` in x units, from 0 (or the axis bottom) up."""
        self._add(_Mark("bars", name, color, list(xs), list(ys), titles=list(titles or []), size=bar_width,
                        labels=labels), legend)
        self._ys.append(0.0)

    def segments(self, name: str, xs: Sequence[float], lows: Sequence[float | None], highs: Sequence[float | None],
                 color: str, *, legend: bool = True) -> None:
        """Vertical segments from ``lows`` to ``highs`` at each x (a range, an error bar)."""
        self._add(_Mark("segments", name, color, list(xs), list(lows), highs=list(highs)), legend)

    def hline(self, name: str, y: float, color: str = "#D55E00", *, dashed: bool = True) -> None:
        """A horizontal reference line across the plot (a budget, an average), labelled at its right end."""
        self._marks.append(_Mark("hline", name, color, [], [float(y)], dashed=dashed))
        self._ys.append(float(y))

    def _add(self, mark: _Mark, legend: bool) -> None:
        self._marks.append(mark)
        self._xs.extend(_finite(list(mark.xs)))
        self._ys.extend(v for v in _finite([*mark.ys, *mark.highs]) if v > 0 or not self.log_y)
        if legend:
            self._legend.append((mark.name, mark.color, mark.dashed))

    # -- scales -------------------------------------------------------------------------------------
    def _ranges(self) -> tuple[tuple[float, float], list[float], tuple[float, float], list[float]]:
        if self.x_labels is not None:
            x_lo, x_hi = -0.5, len(self.x_labels) - 0.5
            x_ticks: list[float] = []
        else:
            lo, hi = self.x_range or ((min(self._xs), max(self._xs)) if self._xs else (0.0, 1.0))
            x_ticks = nice_ticks(lo, hi, 8)
            x_lo, x_hi = (lo, hi) if self.x_range else (x_ticks[0], x_ticks[-1])
            x_ticks = [t for t in x_ticks if x_lo - 1e-9 <= t <= x_hi + 1e-9]
        if self.log_y:
            ys = [y for y in self._ys if y > 0] or [1.0]
            lo_e = math.floor(math.log10(min(ys)))
            hi_e = math.ceil(math.log10(max(ys)))
            if hi_e == lo_e:
                hi_e += 1
            y_ticks = [10.0 ** e for e in range(lo_e, hi_e + 1)]
            return (x_lo, x_hi), x_ticks, (10.0 ** lo_e, 10.0 ** hi_e), y_ticks
        if self.y_range is not None:
            y_lo, y_hi = self.y_range
            ticks = [t for t in nice_ticks(y_lo, y_hi, 5) if y_lo - 1e-9 <= t <= y_hi + 1e-9]
            return (x_lo, x_hi), x_ticks, (y_lo, y_hi), ticks
        ys = self._ys or [0.0, 1.0]
        lo = min(0.0, min(ys)) if self.y_zero else min(ys)
        hi = max(ys)
        # headroom: a series or reference line at the maximum should not run along the frame, and a
        # bar's value label needs a line of text above it
        room = 0.12 if any(m.kind == "bars" and m.labels for m in self._marks) else 0.04
        y_ticks = nice_ticks(lo, hi + room * (hi - lo), 5)
        return (x_lo, x_hi), x_ticks, (y_ticks[0], y_ticks[-1]), y_ticks

    # -- output -------------------------------------------------------------------------------------
    def svg(self) -> str:
        (x_lo, x_hi), x_ticks, (y_lo, y_hi), y_ticks = self._ranges()
        w = self.width
        # legend entries flow in rows under the title; each extra row makes the chart taller
        legend: list[tuple[float, int, str, str, bool]] = []
        lx, row = float(_LEFT), 0
        for name, color, dashed in self._legend:
            size = 32 + 7.2 * len(name)
            if lx + size > w - _RIGHT and lx > _LEFT:
                lx, row = float(_LEFT), row + 1
            legend.append((lx, row, name, color, dashed))
            lx += size
        extra = 16 * (legend[-1][1] if legend else 0)
        top, h = _TOP + extra, self.height + extra
        pw, ph = w - _LEFT - _RIGHT, h - top - _BOTTOM

        def sx(x: float) -> float:
            return _LEFT + (x - x_lo) / (x_hi - x_lo or 1.0) * pw

        def sy(y: float) -> float:
            if self.log_y:
                y = math.log10(y)
                lo, hi = math.log10(y_lo), math.log10(y_hi)
            else:
                lo, hi = y_lo, y_hi
            return top + ph - (y - lo) / (hi - lo or 1.0) * ph

        def ok(y: float | None) -> bool:
            return y is not None and math.isfinite(y) and (y > 0 or not self.log_y)

        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {w} {h}" width="{w}" '
               f'height="{h}" role="img" aria-label="{_e(self.title)}"'
               + (f' data-chart="{_e(self.chart_id)}"' if self.chart_id else "") + ">",
               f'<text class="title" x="{_LEFT}" y="20">{_e(self.title)}</text>']
        for lx, row, name, color, dashed in legend:
            ly = _LEGEND_Y + 16 * row
            dash = ' stroke-dasharray="5 3"' if dashed else ""
            out.append(f'<line x1="{lx:.0f}" y1="{ly - 4}" x2="{lx + 18:.0f}" y2="{ly - 4}" '
                       f'stroke="{color}" stroke-width="3"{dash}/>')
            out.append(f'<text class="legend" x="{lx + 22:.0f}" y="{ly}">{_e(name)}</text>')
        # grid and axes
        for t in y_ticks:
            gy = sy(t)
            out.append(f'<line class="grid" x1="{_LEFT}" y1="{gy:.1f}" x2="{_LEFT + pw}" y2="{gy:.1f}"/>')
            out.append(f'<text class="tick" x="{_LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
        if self.x_labels is not None:
            for i, label in enumerate(self.x_labels):
                out.append(f'<text class="tick" x="{sx(i):.1f}" y="{top + ph + 16}" text-anchor="middle">'
                           f"{_e(label)}</text>")
        else:
            for t in x_ticks:
                gx = sx(t)
                out.append(f'<line class="grid" x1="{gx:.1f}" y1="{top}" x2="{gx:.1f}" y2="{top + ph}"/>')
                out.append(f'<text class="tick" x="{gx:.1f}" y="{top + ph + 16}" text-anchor="middle">'
                           f"{fmt(t)}</text>")
        out.append(f'<rect class="frame" x="{_LEFT}" y="{top}" width="{pw}" height="{ph}"/>')
        if self.x_label:
            out.append(f'<text class="axis" x="{_LEFT + pw / 2:.0f}" y="{h - 6}" text-anchor="middle">'
                       f"{_e(self.x_label)}</text>")
        if self.y_label:
            out.append(f'<text class="axis" transform="translate(14 {top + ph / 2:.0f}) rotate(-90)" '
                       f'text-anchor="middle">{_e(self.y_label)}</text>')
        # marks, clipped to the plot area
        clip = f"clip{next(_CLIP_IDS)}"  # unique within a page that holds several charts
        out.append(f'<clipPath id="{clip}"><rect x="{_LEFT}" y="{top - 2}" width="{pw}" '
                   f'height="{ph + 4}"/></clipPath>')
        out.append(f'<g clip-path="url(#{clip})">')
        base = sy(y_lo) if self.log_y or y_lo > 0 else sy(0.0)
        labels: list[str] = []
        self._draw_marks(out, labels, sx, sy, ok, base, pw)
        out.append("</g>")
        out.extend(labels)  # outside the clip: a label above a line at the top stays readable
        out.append("</svg>")
        return "".join(out)

    def _draw_marks(self, out: list[str], labels: list[str], sx: Callable[[float], float],
                    sy: Callable[[float], float], ok: Callable[[float | None], bool], base: float, pw: float) -> None:
        """Every mark as SVG into ``out`` (in plot coordinates by ``sx``/``sy``); reference-line labels into
        ``labels``, which go outside the clip."""
        for m in self._marks:
            if m.kind == "line":
                dash = ' stroke-dasharray="6 4"' if m.dashed else ""
                runs: list[list[str]] = [[]]
                for x, y in zip(m.xs, m.ys):
                    if y is not None and ok(y):
                        runs[-1].append(f"{sx(x):.1f},{sy(y):.1f}")
                    elif runs[-1]:
                        runs.append([])
                for run in (r for r in runs if r):
                    out.append(f'<polyline class="series" data-series="{_e(m.name)}" fill="none" stroke="{m.color}" '
                               f'stroke-width="{m.size}" stroke-linejoin="round"{dash} points="{" ".join(run)}">'
                               f"<title>{_e(m.name)}</title></polyline>")
                    if len(run) == 1:  # a lone point draws nothing as a line
                        cx, cy = run[0].split(",")
                        out.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{m.color}"/>')
            elif m.kind == "points":
                for i, (x, y) in enumerate(zip(m.xs, m.ys)):
                    if y is not None and ok(y):
                        tip = m.titles[i] if i < len(m.titles) else f"{m.name}: {fmt(y)}"
                        out.append(f'<circle class="point" data-series="{_e(m.name)}" data-value="{y:.6g}" '
                                   f'cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{m.size}" fill="{m.color}">'
                                   f"<title>{_e(tip)}</title></circle>")
            elif m.kind == "bars":
                half = m.size / 2
                for i, (x, y) in enumerate(zip(m.xs, m.ys)):
                    if y is None or not ok(y):
                        continue
                    x0, x1 = sx(x - half), sx(x + half)
                    bar_top = sy(y)
                    tip = m.titles[i] if i < len(m.titles) else f"{m.name}: {fmt(y)}"
                    out.append(f'<rect class="bar" data-series="{_e(m.name)}" data-value="{y:.6g}" '
                               f'x="{x0:.1f}" y="{min(bar_top, base):.1f}" width="{max(x1 - x0, 1):.1f}" '
                               f'height="{abs(base - bar_top):.1f}" fill="{m.color}"><title>{_e(tip)}</title></rect>')
                    if m.labels:
                        out.append(f'<text class="value" x="{(x0 + x1) / 2:.1f}" y="{min(bar_top, base) - 3:.1f}" '
                                   f'text-anchor="middle">{fmt(y, 3)}</text>')
            elif m.kind == "segments":
                for x, lo, hi in zip(m.xs, m.ys, m.highs):
                    if lo is not None and hi is not None and ok(lo) and ok(hi):
                        px = sx(x)
                        out.append(f'<line class="segment" data-series="{_e(m.name)}" x1="{px:.1f}" '
                                   f'y1="{sy(lo):.1f}" x2="{px:.1f}" y2="{sy(hi):.1f}" '
                                   f'stroke="{m.color}" stroke-width="1.5"/>')
            elif m.kind == "hline":
                y = m.ys[0]
                if y is not None and ok(y):
                    py = sy(y)
                    dash = ' stroke-dasharray="7 4"' if m.dashed else ""
                    out.append(f'<line class="hline" data-series="{_e(m.name)}" data-value="{y:.6g}" '
                               f'x1="{_LEFT}" y1="{py:.1f}" x2="{_LEFT + pw}" y2="{py:.1f}" stroke="{m.color}" '
                               f'stroke-width="1.5"{dash}><title>{_e(m.name)}</title></line>')
                    labels.append(f'<text class="hlabel" x="{_LEFT + pw - 4}" y="{py - 4:.1f}" text-anchor="end" '
                                  f'fill="{m.color}">{_e(m.name)}</text>')


def hbar_chart(title: str, labels: Sequence[str], values: Sequence[float], *, color: str = PALETTE[0],
               value_label: str = "", chart_id: str = "", width: int = 760, label_width: int = 260) -> str:
    """Horizontal bars, one row per label (long names such as layer names), largest scale at the top."""
    row = 18
    h = 40 + row * len(labels) + 26
    vmax = max(_finite(list(values)) or [1.0])
    ticks = nice_ticks(0.0, vmax if vmax > 0 else 1.0, 4)
    pw = width - label_width - 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {h}" width="{width}" '
           f'height="{h}" role="img" aria-label="{_e(title)}"' + (f' data-chart="{_e(chart_id)}"' if chart_id else "")
           + ">", f'<text class="title" x="8" y="20">{_e(title)}</text>']

    def sx(v: float) -> float:
        return label_width + v / (ticks[-1] or 1.0) * pw

    for t in ticks:
        out.append(f'<line class="grid" x1="{sx(t):.1f}" y1="34" x2="{sx(t):.1f}" y2="{h - 24}"/>')
        out.append(f'<text class="tick" x="{sx(t):.1f}" y="{h - 10}" text-anchor="middle">{fmt(t)}</text>')
    for i, (label, value) in enumerate(zip(labels, values)):
        y = 40 + i * row
        short = label if len(label) <= 40 else "…" + label[-39:]
        out.append(f'<text class="tick" x="{label_width - 6}" y="{y + 12}" text-anchor="end">{_e(short)}'
                   f"<title>{_e(label)}</title></text>")
        if math.isfinite(float(value)):
            out.append(f'<rect class="bar" data-series="{_e(label)}" data-value="{float(value):.6g}" '
                       f'x="{label_width}" y="{y + 2}" width="{max(sx(float(value)) - label_width, 1):.1f}" '
                       f'height="{row - 5}" fill="{color}"><title>{_e(label)}: {fmt(float(value))}'
                       f"{_e(' ' + value_label) if value_label else ''}</title></rect>")
            out.append(f'<text class="value" x="{sx(float(value)) + 4:.1f}" y="{y + 12}">{fmt(float(value), 3)}</text>')
    out.append("</svg>")
    return "".join(out)
