"""The calibration report: JSON for machines, a table and an HTML page (charts) for people.

Per tensor: the range found, how it compares to the largest value seen, whether it got a Q/DQ pair,
went to the TensorRT cache, or stayed float (and why). Then the accuracy check, time and peak memory.
:func:`write_report` writes the JSON and, beside it (``X.report.html``), a self-contained page with
per-tensor range and per-layer sensitivity plots (:mod:`edgert.report.calib`).
"""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgert.atomic_file import write_atomic
from edgert.calib.histograms import TensorRange
from edgert.errors import CalibrationError

__all__ = ["format_table", "html_path", "peak_rss_mb", "tensor_rows", "verdict_line", "write_report"]


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def tensor_rows(ranges: Mapping[str, TensorRange], quantized: Sequence[str], cached: Sequence[str],
                tail: set[str], nonfinite: set[str]) -> list[dict[str, Any]]:
    q, c = set(quantized), set(cached)
    rows = []
    for name, r in ranges.items():
        if name in q:
            role = "qdq"
        elif name in nonfinite or r.nonfinite:
            role = "float (non-finite)"
        elif name in tail:
            role = "float (decoding tail)"
        elif name in c:
            role = "cache"
        else:
            role = "float"
        rows.append({
            "tensor": name, "role": role, "amax": round(r.amax, 6), "scale": r.scale,
            "min": round(r.min, 6), "max": round(r.max, 6), "abs_max": round(r.abs_max, 6),
            "clip_ratio": round(r.clipped_fraction_hint, 4), "nonfinite": r.nonfinite, "in_cache": name in c,
        })
    return rows


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def format_table(report: Mapping[str, Any], max_rows: int = 40, tensors: bool = True) -> str:
    """A readable summary: the verdict, the INT8/float trade-off and the check first, then time and memory; the
    per-tensor ranges (quantized ones first) at the end with ``tensors`` (``edgert calibrate -v``)."""
    lines = [verdict_line(report)]
    lines.extend(_tradeoff_lines(report))
    lines.extend(_detail_lines(report))
    if tensors:
        rows = list(report.get("tensors", []))
        shown = [r for r in rows if r["role"] == "qdq"] + [r for r in rows if r["role"] != "qdq"]
        lines += ["", f"{'tensor':<48} {'role':<22} {'amax':>10} {'abs max':>10} {'amax/max':>8}"]
        for r in shown[:max_rows]:
            lines.append(f"{_short(r['tensor'], 48):<48} {r['role']:<22} {r['amax']:>10.4g} {r['abs_max']:>10.4g} "
                         f"{r['clip_ratio']:>8.3f}")
        if len(shown) > max_rows:
            lines.append(f"... {len(shown) - max_rows} more tensors in the JSON report")
    return "\n".join(lines)


def _tradeoff_lines(report: Mapping[str, Any]) -> list[str]:
    """What the INT8 model gives and costs: its agreement with FP32, its INT8 share, the layers kept float."""
    lines: list[str] = []
    acc = report.get("accuracy")
    if acc and acc.get("map"):
        m, ms = acc["map"], acc.get("map_strict", {})
        lines.append(f"accuracy     mAP@0.5:0.95 {m.get('map50_95')} (mAP@0.5 {m.get('map50')}) vs FP32 detections "
                     f"on {acc.get('frames')} frames ({acc.get('frames_from')}); strict {ms.get('map50_95')}")
    elif acc and acc.get("outputs"):
        errs = ", ".join(f"{o['output']}: normalized MSE {o['normalized_mse']}" for o in acc["outputs"])
        lines.append(f"accuracy     {errs}")
    elif acc and acc.get("skipped"):
        lines.append(f"accuracy     not measured: {acc['skipped']}")
    macs = report.get("macs")
    if macs:
        lines.append(f"INT8 MACs    {100 * macs['int8_share']:.1f} % of {macs['total_macs'] / 1e9:.3g} G multiply-"
                     f"accumulates ({macs['int8_layers']} of {macs['layers']} Conv/Gemm/MatMul layers in INT8)")
    sens_float = {n: why for n, why in (report.get("float_layers") or {}).items() if why.startswith("sensitivity")}
    for n, why in list(sens_float.items())[:8]:
        lines.append(f"float        {_short(n, 40)}: {why}")
    if len(sens_float) > 8:
        lines.append(f"float        ... {len(sens_float) - 8} more in the JSON report")
    engine = report.get("engine")
    if engine:
        lines.append(f"engine       TensorRT-RTX {engine.get('tensorrt_rtx', '')}: {engine.get('engine_mb')} MB"
                     if engine.get("built") else f"engine       not built: {engine.get('why')}")
    return lines


def _detail_lines(report: Mapping[str, Any]) -> list[str]:
    s = report.get("summary", {})
    lines = [f"model        {report.get('model')}  ->  {report.get('output')}"]
    lines.append(f"method       {report.get('method')}  images {report.get('images', {}).get('used')} "
                 f"(skipped {report.get('images', {}).get('skipped')})  seed {report.get('seed')}")
    lines.append(f"quantized    {s.get('quantized_layers')} layers, {s.get('qdq_tensors')} activation Q/DQ pairs; "
                 f"{s.get('float_layers')} layers kept float; {s.get('cache_tensors')} tensors in the TensorRT cache")
    eq = report.get("equalization")
    if eq:
        convs = sum(len(r["sources"]) for r in eq.get("regions", []))
        lines.append(f"equalised    {eq.get('ranges')} (alpha {eq.get('alpha')}): {convs} convs rescaled in "
                     f"{len(eq.get('regions', []))} regions, {len(eq.get('not_rescaled', {}))} regions left alone "
                     "(why: the JSON report's equalization)")
    t = report.get("timing_s", {})
    lines.append(f"time         {t.get('total')} s (statistics {t.get('collect')} s, equalise "
                 f"{t.get('equalize', 0)} s, ranges {t.get('ranges')} s, check {t.get('check')} s, "
                 f"sensitivity {t.get('sensitivity')} s)")
    lines.append(f"peak memory  {report.get('peak_rss_mb')} MiB RSS")
    cache = report.get("trt_cache") or {}
    if cache and not cache.get("written"):
        lines.append(f"trt cache    none: {cache.get('why')}")
    files = report.get("files", {})
    lines.append(f"wrote        {', '.join(str(v) for v in files.values())}")
    return lines


def verdict_line(report: Mapping[str, Any]) -> str:
    """The first line of the summary: whether the accuracy target is met, at what INT8 share."""
    v = report.get("verdict") or {}
    share = v.get("int8_mac_share")
    at = f"; {100 * share:.1f} % of MACs in INT8" if share is not None else ""
    if v.get("collapse"):
        return f"COLLAPSED    {v.get('why')}{at}"
    if v.get("met") is True:
        return f"TARGET MET   mAP@0.5:0.95 vs FP32 {v.get('map50_95'):.4f} >= {v.get('target')}{at}"
    if v.get("met") is False:
        return f"TARGET NOT MET   {v.get('why')}{at}" if v.get("failed") else \
            f"BELOW TARGET mAP@0.5:0.95 vs FP32 {v.get('map50_95'):.4f} < {v.get('target')} (the default target: " \
            f"a figure, not a failure; give --max-drop to make it one){at}"
    return f"NO TARGET    {v.get('why', 'no accuracy target')}{at}"


def html_path(path: str | Path) -> Path:
    """Where the page goes beside the JSON report: ``X.report.json`` -> ``X.report.html``."""
    p = Path(path)
    return p.with_suffix(".html")


def write_report(path: str | Path, report: Mapping[str, Any]) -> Path:
    """Write the JSON report to ``path`` and the HTML page to :func:`html_path` of it; return ``path``."""
    from edgert.errors import ReportError
    from edgert.report.calib import calib_report
    from edgert.report.page import write_page

    p = Path(path)
    try:
        write_atomic(p, json.dumps(report, indent=2, default=str) + "\n")  # the report is the up-to-date proof
    except OSError as exc:
        raise CalibrationError(f"{p}: cannot write the report: {exc}") from exc
    try:
        write_page(html_path(p), calib_report(report))
    except ReportError as exc:
        raise CalibrationError(str(exc)) from None
    return p
