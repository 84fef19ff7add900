"""The calibration report as a page: per-tensor ranges and per-layer sensitivity, beside the JSON.

- Ranges: for every calibrated activation tensor, in graph order, the range calibration chose (amax,
  a dot coloured by what became of the tensor: Q/DQ pair, TensorRT cache only, kept float) and the
  largest absolute value seen (a grey tick above it); the grey segment between them is what INT8 clips.
  Log scale, since ranges of one network span decades. Then ``amax / abs max`` per tensor.
- Sensitivity (when ``--max-drop`` ran its pass): each layer's own INT8 output error, mAP@0.5:0.95 against
  FP32 by the share of multiply-accumulates returned to float (the trade-off), and after each step.
- The summary table leads with the verdict (accuracy target met or not) and the INT8 share of the MACs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edgert.report.page import escape, page, table
from edgert.report.svg import Plot, fmt, hbar_chart

__all__ = ["ROLE_COLORS", "calib_report"]

#: Colour of a tensor's dot by its role in the report (``tensor_rows``); anything else is grey.
ROLE_COLORS: dict[str, str] = {
    "qdq": "#0072B2",
    "cache": "#E69F00",
    "float": "#999999",
    "float (decoding tail)": "#009E73",
    "float (non-finite)": "#D55E00",
}


def _ranges(rows: list[Mapping[str, Any]]) -> list[str]:
    parts: list[str] = []
    xs = list(range(len(rows)))
    width = max(760, min(1060, 200 + 6 * len(rows)))
    plot = Plot(f"Calibrated range per activation tensor ({len(rows)}, graph order)", x_label="tensor",
                y_label="|value| (log)", log_y=True, width=width, height=320, chart_id="ranges",
                x_range=(-0.5, len(rows) - 0.5))
    plot.segments("clipped (amax to abs max)", xs, [r.get("amax") for r in rows], [r.get("abs_max") for r in rows],
                  "#cccccc")
    plot.points("abs max seen", xs, [r.get("abs_max") for r in rows], "#bbbbbb", radius=1.8,
                titles=[f"{r['tensor']}: abs max {fmt(float(r['abs_max']))}" for r in rows])
    roles = list(dict.fromkeys(str(r.get("role")) for r in rows))
    for role in sorted(roles, key=lambda x: list(ROLE_COLORS).index(x) if x in ROLE_COLORS else 99):
        idx = [i for i, r in enumerate(rows) if r.get("role") == role]
        plot.points(f"amax: {role}", idx, [rows[i].get("amax") for i in idx], ROLE_COLORS.get(role, "#555555"),
                    titles=[f"{rows[i]['tensor']} ({role}): amax {fmt(float(rows[i]['amax']))}, "
                            f"abs max {fmt(float(rows[i]['abs_max']))}" for i in idx])
    parts.append(plot.svg())

    ratio = Plot("amax / abs max per tensor (1: nothing clipped)", x_label="tensor", y_label="ratio",
                 y_range=(0.0, 1.05), width=width, height=220, chart_id="clip-ratio",
                 x_range=(-0.5, len(rows) - 0.5))
    ratio.points("amax / abs max", xs, [r.get("clip_ratio") for r in rows], "#0072B2", radius=2.2,
                 titles=[f"{r['tensor']}: {fmt(float(r['clip_ratio']))}" for r in rows], legend=False)
    parts.append(ratio.svg())
    return parts


def _sensitivity(sens: Mapping[str, Any], max_drop: float | None) -> list[str]:
    parts: list[str] = []
    scores = sens.get("scores")
    if isinstance(scores, Mapping) and scores:  # every layer, when the report carries them all
        pairs = sorted(((str(k), float(v)) for k, v in scores.items()), key=lambda kv: -kv[1])
    else:
        pairs = [(str(m.get("node")), float(m.get("error", 0.0))) for m in sens.get("most_sensitive") or []]
    kept = set(sens.get("float_layers") or [])
    if pairs:
        parts.append(hbar_chart(f"Sensitivity per layer: its own INT8 output error (noise / signal) "
                                f"({len(pairs)} most sensitive; left in float: {len(kept)})",
                                [f"{n} (float)" if n in kept else n for n, _ in pairs], [v for _, v in pairs],
                                value_label="error", chart_id="sensitivity"))
    steps = [s for s in sens.get("steps") or [] if s.get("map50_95") is not None]
    shares = [s for s in steps if s.get("float_macs") is not None]
    if shares:  # the trade-off: accuracy against the share of compute handed back to float
        values = [float(s["map50_95"]) for s in shares] + ([1.0 - max_drop] if max_drop is not None else [])
        low = max(0.0, math.floor((min(values) - 0.02) * 20) / 20)
        top = max(float(s["float_macs"]) for s in shares) * 100
        trade = Plot("mAP@0.5:0.95 against FP32 by the share of MACs in float (the options tried)",
                     x_label="% of MACs in float", y_label="mAP@0.5:0.95", y_range=(low, 1.0),
                     x_range=(0.0, max(1.0, top * 1.1)), chart_id="accuracy-vs-float", height=240)
        xs = [100 * float(s["float_macs"]) for s in shares]
        trade.points("step", xs, [float(s["map50_95"]) for s in shares], "#0072B2",
                     titles=[f"{s['float_layers']} layer(s), {fmt(x)} % of MACs float: {fmt(float(s['map50_95']))}"
                             for s, x in zip(shares, xs)])
        if max_drop is not None:
            trade.hline(f"target {fmt(1.0 - max_drop)}", 1.0 - max_drop, "#D55E00")
        parts.append(trade.svg())
    if steps:
        # one category per step: the steps grow 1, 2, 3, 4, 6, 8, ... layers, not evenly
        values = [float(s["map50_95"]) for s in steps] + ([1.0 - max_drop] if max_drop is not None else [])
        low = max(0.0, math.floor((min(values) - 0.02) * 20) / 20)  # a 0.05 step below the lowest, up to 1
        plot = Plot("mAP@0.5:0.95 against FP32 as layers return to float", x_label="layers in float",
                    y_label="mAP@0.5:0.95", y_range=(low, 1.0), chart_id="sensitivity-steps", height=240,
                    x_labels=[str(s.get("float_layers", i + 1)) for i, s in enumerate(steps)],
                    width=max(360, min(760, 160 + 60 * len(steps))))
        xs = [float(i) for i in range(len(steps))]
        plot.line("mAP@0.5:0.95", xs, [float(s["map50_95"]) for s in steps], "#0072B2")
        plot.points("step", xs, [float(s["map50_95"]) for s in steps], "#0072B2", legend=False)
        if max_drop is not None:
            plot.hline(f"target {fmt(1.0 - max_drop)}", 1.0 - max_drop, "#D55E00")
        parts.append(plot.svg())
    parts.append(f'<p class="note">Target {"met" if sens.get("target_met") else "not met"}; layers left in float: '
                 f"{escape(', '.join(sorted(kept)) or 'none')}.</p>")
    return parts


def calib_report(report: Mapping[str, Any]) -> str:
    """The page for a calibration report (the dict ``edgert calibrate`` writes as JSON)."""
    rows = [r for r in report.get("tensors") or [] if isinstance(r, Mapping)]
    parts: list[str] = []
    s = report.get("summary") or {}
    images = report.get("images") or {}
    verdict = report.get("verdict") or {}
    macs = report.get("macs") or {}
    met = verdict.get("met")
    overview: dict[str, Any] = {
        "verdict": ("target met" if met is True else "target NOT met: " + str(verdict.get("why")) if met is False
                    else f"no target ({verdict.get('why', 'not recorded')})"),
        "INT8 share of multiply-accumulates": (f"{100 * float(macs['int8_share']):.1f} % "
                                               f"({macs.get('int8_layers')} of {macs.get('layers')} layers)"
                                               if macs else None),
        "TensorRT-RTX engine (MB)": ((report.get("engine") or {}).get("engine_mb")
                                     if (report.get("engine") or {}).get("built") else None),
        "model": report.get("model"), "output": report.get("output"), "method": report.get("method"),
        "images used": images.get("used"), "images skipped": images.get("skipped"), "seed": report.get("seed"),
        "quantized layers": s.get("quantized_layers"), "Q/DQ activation tensors": s.get("qdq_tensors"),
        "layers kept float": s.get("float_layers"), "tensors in the TensorRT cache": s.get("cache_tensors"),
    }
    acc = report.get("accuracy") or {}
    if acc.get("map"):
        overview["mAP@0.5:0.95 vs FP32"] = acc["map"].get("map50_95")
        overview["mAP@0.5 vs FP32"] = acc["map"].get("map50")
    elif acc.get("skipped"):
        overview["accuracy"] = f"not measured: {acc['skipped']}"
    overview["time (s)"] = (report.get("timing_s") or {}).get("total")
    overview["peak memory (MiB RSS)"] = report.get("peak_rss_mb")
    parts.append(table(overview))
    if rows:
        parts.append("<h2>Ranges</h2>")
        parts += _ranges(rows)
    else:
        parts.append('<p class="note">No tensor ranges in this report.</p>')
    sens = report.get("sensitivity")
    if isinstance(sens, Mapping) and sens:
        parts.append("<h2>Sensitivity</h2>")
        max_drop = report.get("max_drop")
        parts += _sensitivity(sens, float(max_drop) if isinstance(max_drop, (int, float)) else None)
    floats = report.get("float_layers") or {}
    if floats:
        parts.append("<h2>Layers kept in float</h2>")
        parts.append(table(floats))
    if rows:
        parts.append("<h2>Tensors</h2>")
        head = "".join(f"<th>{h}</th>" for h in ("#", "tensor", "role", "amax", "abs max", "amax / abs max"))
        body = "".join(
            f'<tr><td class="num">{i}</td><td>{escape(r.get("tensor"))}</td><td>{escape(r.get("role"))}</td>'
            f'<td class="num">{fmt(float(r.get("amax", 0.0)))}</td><td class="num">{fmt(float(r.get("abs_max", 0.0)))}'
            f'</td><td class="num">{fmt(float(r.get("clip_ratio", 0.0)), 3)}</td></tr>'
            for i, r in enumerate(rows))
        parts.append(f'<table class="tensors"><tr>{head}</tr>{body}</table>')
    model = str(report.get("model") or "model").replace("\\", "/").rsplit("/", 1)[-1]
    data = {k: report.get(k) for k in ("model", "output", "method", "verdict", "macs", "summary", "accuracy",
                                       "sensitivity", "float_layers", "tensors", "timing_s")}
    return page(f"edgert calibrate: {model}", "\n".join(parts), subtitle=f"method {report.get('method')}",
                data=data)
