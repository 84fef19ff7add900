"""``edgert info``: what this machine is and which backend edgert will use."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("info", help="describe this machine: Jetson, GPU, CUDA, runtimes, backend")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _yes(entry: Any) -> str:
    if not isinstance(entry, dict):
        return str(entry)
    if entry.get("installed"):
        return str(entry.get("version", "yes"))
    return "no"


def machine_report() -> dict[str, Any]:
    """Everything ``edgert info`` shows, as JSON-ready data: the machine's facts and the backend choice."""
    from edgert.backends import choose_backend
    from edgert.platform import machine_facts

    report = machine_facts()
    try:
        name, probes = choose_backend()
    except Exception as exc:  # one failing probe must not hide the others
        report["backend"] = {"chosen": None, "why": f"{type(exc).__name__}: {exc}"}
    else:
        report["backend"] = {
            "chosen": name,
            "candidates": [{"name": p.name, "available": p.available, "reason": p.reason} for p in probes],
        }
    return report


def run(args: argparse.Namespace) -> int:
    report = machine_report()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    s, j, g = report["system"], report["jetson"], report["gpu"]
    lines = [
        f"system       {s.get('os')} {s.get('machine')}, {s.get('cpu')} x{s.get('cpu_count')}, "
        f"Python {s.get('python')}",
    ]
    if j.get("is_jetson"):
        lines.append(f"jetson       {j.get('model')}  L4T {j.get('l4t', '?')}  JetPack {j.get('jetpack', '?')}")
    else:
        lines.append("jetson       no")
    if g.get("present"):
        gpu = g.get("name") or g.get("why")
        cc = f" (compute {g['compute_capability']})" if g.get("compute_capability") else ""
        lines.append(f"gpu          {gpu}{cc}")
    else:
        lines.append(f"gpu          none: {g.get('why')}")
    lines.append(f"cuda         {report['cuda'].get('version') or 'not found'}")
    lines.append(f"tensorrt     {_yes(report['tensorrt'])}")
    lines.append(f"tensorrt-rtx {_yes(report['tensorrt_rtx'])}")
    ort = report["onnxruntime"]
    providers = f" ({', '.join(ort.get('providers', []))})" if ort.get("installed") else ""
    lines.append(f"onnxruntime  {_yes(ort)}{providers}")
    lines.append(f"pycuda       {_yes(report['pycuda'])}")
    cv = report["opencv"]
    gst = f" (GStreamer: {'yes' if cv.get('gstreamer') else 'no'})" if cv.get("installed") else ""
    lines.append(f"opencv       {_yes(cv)}{gst}")
    cams = report["cameras"]
    lines.append(f"cameras      {', '.join(cams) if isinstance(cams, list) and cams else 'none'}")
    lines.append(f"power mode   {report['power_mode'].get('mode') or report['power_mode'].get('why')}")
    b = report["backend"]
    lines.append(f"backend      {b.get('chosen') or 'none'}")
    for c in b.get("candidates", []):
        mark = "+" if c["available"] else "-"
        lines.append(f"  {mark} {c['name']:<16} {c['reason']}")
    print("\n".join(lines))
    return 0
