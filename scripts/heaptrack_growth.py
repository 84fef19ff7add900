#!/usr/bin/env python3
"""What a heaptrack recording says about native memory over a run: the live heap over time, the frame-sized
allocations made again and again, and what grew between two moments, by call stack.

    python3 scripts/heaptrack_growth.py soak.heaptrack.gz --between 40 100 --out growth.json

The recording is what ``scripts/soak.py --heaptrack FILE.gz`` writes (heaptrack's interpreted format, gzip):
``a SIZE TRACE`` defines an allocation kind, ``+ K`` / ``- K`` allocate and free one of kind K, ``c MS`` is the
time, ``t IP PARENT`` and ``i ADDR MODULE FUNCTION ...`` the call stacks, ``s`` the strings. ``heaptrack_print``
answers other questions (peaks, leaks at exit); this one answers "does the live heap grow after warm-up, and
from where", which needs the heap at two moments of the run. Times are seconds since the process started.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from typing import Any

#: Interpreter frames left out of the stacks shown (they say nothing about who allocates).
_NOISE = ("_Py", "PyObject_", "cfunction_", "method_vectorcall", "do_call_core", "slot_tp_", "type_call",
          "__Pyx_Py", "vectorcall_method", "_PyEval")


class Recording:
    def __init__(self) -> None:
        self.strings = [""]
        self.ips: list[list[str]] = [[]]
        self.traces: list[tuple[int, int]] = [(0, 0)]
        self.size_of: list[int] = []
        self.trace_of: list[int] = []

    def stack(self, trace: int, depth: int = 12) -> list[str]:
        out: list[str] = []
        while trace and len(out) < depth:
            ip, parent = self.traces[trace]
            parts = self.ips[ip]
            module = self.strings[int(parts[1], 16)].rsplit("/", 1)[-1] if len(parts) > 1 else "?"
            function = self.strings[int(parts[2], 16)] if len(parts) > 2 else "?"
            if not function.startswith(_NOISE):
                out.append(f"{function} [{module}]")
            trace = parent
        return out


def analyse(path: str, between: tuple[float, float], big: int, every: float) -> dict[str, Any]:
    rec = Recording()
    live: collections.Counter[int] = collections.Counter()
    made: collections.Counter[int] = collections.Counter()  # big allocations made, by kind
    snaps: dict[float, collections.Counter[int]] = {}
    series: list[dict[str, float]] = []
    live_bytes = live_big = rss_pages = 0
    now, last_step = 0.0, -1
    with gzip.open(path, "rt", errors="replace") as lines:
        for line in lines:
            kind = line[0]
            if kind == "+":
                k = int(line[2:], 16)
                size = rec.size_of[k]
                live[k] += 1
                live_bytes += size
                if size >= big:
                    live_big += size
                    made[k] += 1
            elif kind == "-":
                k = int(line[2:], 16)
                size = rec.size_of[k]
                live[k] -= 1
                live_bytes -= size
                if size >= big:
                    live_big -= size
            elif kind == "a":
                _, size_hex, trace_hex = line.split()
                rec.size_of.append(int(size_hex, 16))
                rec.trace_of.append(int(trace_hex, 16))
            elif kind == "s":
                rec.strings.append(line[2:].rstrip("\n").split(" ", 1)[1] if " " in line[2:] else "")
            elif kind == "i":
                rec.ips.append(line.split()[1:])
            elif kind == "t":
                _, ip, parent = line.split()
                rec.traces.append((int(ip, 16), int(parent, 16)))
            elif kind == "R":
                rss_pages = int(line[2:], 16)
            elif kind == "c":
                now = int(line[2:], 16) / 1000.0
                for mark in between:
                    if now >= mark and mark not in snaps:
                        snaps[mark] = collections.Counter(live)
                if int(now / every) != last_step:
                    last_step = int(now / every)
                    series.append({"s": round(now, 1), "live_mb": round(live_bytes / 1e6, 3),
                                   "live_big_mb": round(live_big / 1e6, 3), "rss_mb": round(rss_pages * 4096 / 1e6, 2)})
    series.append({"s": round(now, 1), "live_mb": round(live_bytes / 1e6, 3), "live_big_mb": round(live_big / 1e6, 3),
                   "rss_mb": round(rss_pages * 4096 / 1e6, 2)})
    # frame-sized allocations by call stack: how many were made over the run (per frame when ~ the frame count)
    by_trace: dict[int, dict[str, Any]] = {}
    for k, count in made.items():
        row = by_trace.setdefault(rec.trace_of[k], {"made": 0, "sizes": set()})
        row["made"] += count
        row["sizes"].add(rec.size_of[k])
    repeated = [{"made": row["made"], "sizes": sorted(row["sizes"])[:4], "stack": rec.stack(trace)}
                for trace, row in sorted(by_trace.items(), key=lambda item: -int(item[1]["made"]))[:6]]
    out: dict[str, Any] = {"recording": path, "big_bytes": big, "series": series, "repeated_big_allocations": repeated}
    if len(snaps) == 2:
        first, second = snaps[between[0]], snaps[between[1]]
        grew: collections.Counter[int] = collections.Counter()
        blocks: collections.Counter[int] = collections.Counter()
        for k in set(first) | set(second):
            diff = second[k] - first[k]
            if diff:
                grew[rec.trace_of[k]] += diff * rec.size_of[k]
                blocks[rec.trace_of[k]] += diff
        out["growth"] = {"from_s": between[0], "to_s": between[1], "bytes": sum(grew.values()),
                         "top": [{"bytes": size, "blocks": blocks[trace], "stack": rec.stack(trace)}
                                 for trace, size in grew.most_common(6)]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", help="a heaptrack .gz (scripts/soak.py --heaptrack)")
    parser.add_argument("--between", nargs=2, type=float, default=(40.0, 100.0), metavar=("FROM_S", "TO_S"),
                        help="the two moments (seconds since the process started) to compare the live heap at")
    parser.add_argument("--big", type=int, default=256 * 1024, help="bytes from which an allocation is frame-sized")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between the series' points")
    parser.add_argument("--out", default=None, help="write the result here as JSON")
    args = parser.parse_args()
    result = analyse(args.recording, (args.between[0], args.between[1]), args.big, args.every)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    growth = result.get("growth")
    repeated = [(r["made"], r["sizes"], r["stack"][:2]) for r in result["repeated_big_allocations"]]
    print(json.dumps({"growth_bytes": None if growth is None else growth["bytes"], "repeated": repeated}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
