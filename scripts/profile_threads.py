#!/usr/bin/env python3
"""CPU per pipeline thread of one ``edgert run``, from /proc, without stopping the process (Linux).

``edgert run`` runs in this process; a sampler thread reads every thread's user + system CPU time
(``/proc/self/task/TID/stat``) every ``--interval`` seconds and names it by its Python thread name. Each role's CPU
over its threads' life (capture, batcher, slots, results, ...) is printed and written as JSON: for threads that
run Python (capture, batcher, results) that is close to the time they held the interpreter lock, which the slot
threads need to feed the engine (docs/pipeline.md, issue 28). Unlike a stack sampler in its default mode
(py-spy stops the process for each sample), nothing here slows the run beyond the reads themselves.

    python3 scripts/profile_threads.py --out threads.json -- --backend onnxruntime-cuda --model M.onnx \\
        --source a.avi --source a.avi --loop --max-frames 800

Everything after ``--`` is ``edgert run``'s arguments (``--json`` is added).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _bench import machine_info, write_json

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _sample(snaps: dict[str, list[tuple[float, float]]], stop: threading.Event, interval: float) -> None:
    while not stop.is_set():
        now = time.perf_counter()
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid in os.listdir("/proc/self/task"):
            try:
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                comm = names.get(int(tid)) or Path(f"/proc/self/task/{tid}/comm").read_text().strip() + f"#{tid}"
            except (OSError, IndexError):
                continue  # the thread ended between listing and reading
            snaps.setdefault(comm, []).append((now, (int(fields[11]) + int(fields[12])) / _TICK))
        stop.wait(interval)


def roles(snaps: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, Any]]:
    """Per role (a thread name without its number; threads edgert did not name by their command): threads,
    CPU seconds, the longest life and cores (CPU over that life)."""
    out: dict[str, list[float]] = {}
    for name, points in snaps.items():
        if len(points) < 3:
            continue
        role = re.sub(r"\d+$", "N", name.split("#")[0])
        entry = out.setdefault(role, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += points[-1][1] - points[0][1]
        entry[2] = max(entry[2], points[-1][0] - points[0][0])
    return {role: {"threads": int(n), "cpu_s": round(cpu, 2), "span_s": round(span, 2),
                   "cores": round(cpu / span, 3) if span else None}
            for role, (n, cpu, span) in sorted(out.items(), key=lambda kv: -kv[1][1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="profile_threads.json")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then edgert run's arguments")
    args = ap.parse_args()
    run_args = [a for a in args.run_args if a != "--"]
    if not run_args:
        ap.error("give edgert run's arguments after --")
    from edgert.cli.main import main as edgert_main

    snaps: dict[str, list[tuple[float, float]]] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(snaps, stop, args.interval), daemon=True, name="sampler")
    sampler.start()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = edgert_main(["run", *run_args, "--json"])
    stop.set()
    sampler.join()
    if code != 0:
        print(f"profile_threads: edgert run exited {code}", file=sys.stderr)
        return int(code)
    text = printed.getvalue()
    summary = json.loads(text[text.index("{"):])
    result = {"machine": machine_info(), "argv": run_args, "fps": summary["fps"], "frames": summary["frames"],
              "latency_ms": summary["latency_ms"], "gpu_ms": summary.get("gpu_ms"), "threads": roles(snaps)}
    print(f"{summary['frames']} frames at {summary['fps']} fps")
    for role, r in result["threads"].items():
        print(f"  {role:24s} {r['threads']:4d} threads  {r['cpu_s']:8.2f} s CPU  {r['cores']} cores")
    write_json(args.out, result)
    return 0


if __name__ == "__main__":  # spawned capture workers import this module again: nothing runs then
    sys.exit(main())
