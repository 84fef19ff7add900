"""The parts every report page shares: the HTML document, tables, an early write check, atomic writes.

A page is one file with its styles and SVG charts inline and no script or link that reaches the
network, so it opens from a Jetson's disk, an e-mail or a CI artifact as it is. The data behind the
charts is in the page too (``<script type="application/json" id="edgert-data">``), for anyone who
wants the numbers rather than the picture. Files are written atomically (a temporary file renamed over
the target), so a viewer that reloads never sees half a page.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgert.atomic_file import remove_stale_temps
from edgert.errors import ReportError
from edgert.report.svg import fmt

__all__ = ["check_writable", "escape", "page", "table", "write_page"]

CSS = """
body { margin: 0 auto; max-width: 1100px; padding: 1em 1.5em 3em; font: 14px/1.45 system-ui, sans-serif;
       color: #222; background: #fff; }
h1 { font-size: 1.35em; margin: .4em 0 .1em; }
h2 { font-size: 1.1em; margin: 1.6em 0 .4em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
p.sub, p.note { color: #666; margin: .2em 0 .8em; }
svg.chart { display: block; max-width: 100%; height: auto; margin: .6em 0 1em; }
svg .title { font-size: 14px; font-weight: 600; fill: #222; }
svg .legend { font-size: 12px; fill: #333; }
svg .tick { font-size: 11px; fill: #555; }
svg .axis { font-size: 12px; fill: #333; }
svg .value { font-size: 10px; fill: #333; }
svg .hlabel { font-size: 11px; font-weight: 600; }
svg .grid { stroke: #e6e6e6; stroke-width: 1; }
svg .frame { fill: none; stroke: #999; stroke-width: 1; }
table { border-collapse: collapse; margin: .3em 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ddd; padding: .2em .6em; vertical-align: top; }
th { background: #f4f4f4; text-align: left; font-weight: 600; }
td.num { text-align: right; }
table table { margin: 0; }
"""

def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


_e = escape


# --------------------------------------------------------------------------------------------------
# Page and table


def page(title: str, body: str, *, subtitle: str = "", data: Any = None) -> str:
    """A whole HTML document: ``body`` (HTML) under a heading, with ``data`` embedded as JSON."""
    made = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    blob = ""
    if data is not None:
        # <, > and & escaped as JSON escapes: no name (``<!--<script>``, ``</script>``) can end or
        # reopen the element, and the parsed data is unchanged.
        text = (json.dumps(_json_safe(data), default=str, allow_nan=False)
                .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))
        blob = f'<script type="application/json" id="edgert-data">{text}</script>\n'
    sub = f"{_e(subtitle)} · " if subtitle else ""
    return (f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{_e(title)}</title>\n'
            f"<style>{CSS}</style>\n</head>\n<body>\n<h1>{_e(title)}</h1>\n"
            f'<p class="sub">{sub}written {_e(made)} by edgert</p>\n{body}\n{blob}</body>\n</html>\n')


def _json_safe(value: Any) -> Any:
    """NaN and infinities as null (JSON has neither), through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _cell(value: Any, depth: int) -> str:
    if isinstance(value, Mapping):
        return table(value, depth + 1) if value else "-"
    if isinstance(value, (list, tuple)):
        if not value:
            return "-"
        if all(not isinstance(v, (Mapping, list, tuple)) for v in value):
            shown = ", ".join(_e(_scalar(v)) for v in value[:30])
            return shown + (f" … ({len(value)} in all)" if len(value) > 30 else "")
        return "<br>".join(_cell(v, depth) for v in value[:20]) + (f"<br>… ({len(value)} in all)"
                                                                  if len(value) > 20 else "")
    return _e(_scalar(value))


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return fmt(value, 6) if math.isfinite(value) else str(value)
    return str(value)


def table(data: Mapping[str, Any], depth: int = 0) -> str:
    """``data`` as an HTML table: one row per key; nested mappings nest, and a mapping whose values are
    mappings with the same keys (latency per stage) becomes one grid with those keys as columns."""
    values = list(data.values())
    if values and all(isinstance(v, Mapping) and v for v in values):
        cols = list(values[0].keys())
        if all(list(v.keys()) == cols and not any(isinstance(x, (Mapping, list)) for x in v.values())
               for v in values):
            head = "".join(f"<th>{_e(c)}</th>" for c in cols)
            rows = "".join(f"<tr><th>{_e(k)}</th>" + "".join(f'<td class="num">{_e(_scalar(v[c]))}</td>'
                                                             for c in cols) + "</tr>" for k, v in data.items())
            return f'<table class="grid"><tr><th></th>{head}</tr>{rows}</table>'
    num = ' class="num"'
    rows = "".join(f"<tr><th>{_e(k)}</th><td{num if isinstance(v, (int, float)) else ''}>"
                   f"{_cell(v, depth)}</td></tr>" for k, v in data.items())
    return f'<table class="summary">{rows}</table>'


def check_writable(path: str | Path) -> Path:
    """Fail early, in one line, when the report could not be written at the end of a long run."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ReportError(f"{p}: is a directory. Note: give a file name, e.g. {p / 'report.html'}")
    if not parent.is_dir():
        raise ReportError(f"{p}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ReportError(f"{p}: folder {parent} is not writable")
    return p


def write_page(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: a temporary file beside it, then a rename over it."""
    p = Path(path)
    tmp_name = None
    remove_stale_temps(p.parent if str(p.parent) else ".")  # what killed runs left beside their reports
    try:
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=p.parent if str(p.parent) else ".",
                                         prefix=f".{p.name}.tmp-{os.getpid()}-", delete=False) as tmp:
            tmp_name = tmp.name
            tmp.write(text)
        os.chmod(tmp_name, 0o644)  # NamedTemporaryFile makes it 0600; a report is for reading
        os.replace(tmp_name, p)
    except OSError as exc:
        if tmp_name is not None and os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise ReportError(f"{p}: cannot write the report: {exc.strerror or exc}") from None
    return p
