"""The SVG charts as text: ticks, gaps, bars, reference lines."""

from __future__ import annotations

import math
import re

import pytest

from edgert.report.svg import Plot, fmt, hbar_chart, nice_ticks


@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (0, 37.2), (3.1, 3.4), (0, 0.0042), (0, 12345), (-5, 5), (7, 7)])
def test_ticks_are_round_and_cover_the_range(lo: float, hi: float) -> None:
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 2 <= len(ticks) <= 12
    steps = {round(ticks[i + 1] - ticks[i], 9) for i in range(len(ticks) - 1)}  # no pairwise on 3.8
    assert len(steps) == 1
    mantissa = steps.pop() / 10 ** math.floor(math.log10(ticks[1] - ticks[0]))
    assert round(mantissa, 6) in (1, 2, 2.5, 5)


def test_fmt() -> None:
    assert [fmt(v) for v in (0, 1.5, 2000.0, 12345.0, 0.000123, 3e7)] == ["0", "1.5", "2000", "12345", "0.00012",
                                                                          "3e+07"]


def _points(svg: str, series: str) -> list[list[tuple[float, float]]]:
    runs = re.findall(rf'<polyline[^>]*data-series="{series}"[^>]*points="([^"]*)"', svg)
    return [[tuple(map(float, p.split(","))) for p in run.split()] for run in runs]  # type: ignore[misc]


def test_a_line_breaks_at_gaps_and_higher_values_are_drawn_higher() -> None:
    plot = Plot("t", x_label="s", y_label="fps")
    plot.line("fps", [0, 1, 2, 3, 4, 5], [10, 20, None, 30, float("nan"), 5], "#000")
    plot.hline("budget", 25)
    svg = plot.svg()
    runs = _points(svg, "fps")
    assert [len(r) for r in runs] == [2, 1, 1]
    (a, b), (c,), (d,) = runs
    assert a[0] < b[0] < c[0] < d[0]  # x grows left to right
    assert b[1] < a[1] and c[1] < b[1] and d[1] > a[1]  # SVG y grows downwards
    budget_y = float(re.search(r'class="hline"[^>]*y1="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    assert c[1] < budget_y < b[1]  # 30 above the 25 W line, 20 below it
    assert svg.count("<circle") == 2  # the lone points are drawn as dots


def test_bars_carry_their_values_and_log_scale_drops_non_positive() -> None:
    plot = Plot("bars", x_labels=["a", "b", "c"])
    plot.bars("x", [0, 1, 2], [1.5, 3.0, None], "#123456")
    svg = plot.svg()
    assert re.findall(r'class="bar"[^>]*data-value="([^"]+)"', svg) == ["1.5", "3"]
    heights = [float(h) for h in re.findall(r'class="bar"[^>]*height="([\d.]+)"', svg)]
    assert heights[1] == pytest.approx(2 * heights[0], rel=0.02)
    log = Plot("log", log_y=True)
    log.points("p", [0, 1, 2], [0.01, 0.0, 100.0], "#000")
    svg = log.svg()
    assert svg.count('class="point"') == 2 and ">0.01<" in svg and ">100<" in svg


def test_text_is_escaped_and_hbars_list_every_label() -> None:
    svg = hbar_chart("<layers>", ["conv/1", "a&b"], [0.2, 0.1])
    assert "&lt;layers&gt;" in svg and "a&amp;b" in svg and svg.count('class="bar"') == 2
