#!/usr/bin/env python3
"""Where a pipeline's threads spend their time: ``edgert run`` in-process, sampled every few milliseconds.

A sampler thread reads ``sys._current_frames()`` every ``--interval-ms`` and counts, per pipeline thread
(capture0.., batcher, slot0.., results, sink workers), the innermost frame of edgert's own code and the
innermost frame of all (often a C call that released the GIL: ORT's run, a queue wait, a copy). A thread
that waits for the GIL shows where it stands in the bytecode, so the counts say where the host's time goes,
not only what runs on a CPU. py-spy would be the tool of choice; it needs ptrace and a wheel on the device
machine, this needs nothing.

    python3 scripts/profile_pipeline.py --out prof.json -- --backend onnxruntime-cuda --model M.onnx \\
        --source a.avi --source a.avi --loop --max-frames 1000

Everything after ``--`` is ``edgert run``'s arguments. Prints the top frames per thread and writes JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _bench import ROOT, machine_info, write_json

EDGERT_DIR = str(ROOT / "edgert")


def _where(frame: Any, own_only: bool) -> str:
    while frame is not None:
        code = frame.f_code
        if not own_only or code.co_filename.startswith(EDGERT_DIR):
            return f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"
        frame = frame.f_back
    return "(outside edgert)"


def main() -> int:
    if "--" not in sys.argv:
        print(__doc__)
        return 2
    cut = sys.argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="profile.json")
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--switch-ms", type=float, help="sys.setswitchinterval for the run (Python's default: 5 ms)")
    ap.add_argument("--no-sample", action="store_true", help="run without the sampler (its own cost, for comparison)")
    args = ap.parse_args(sys.argv[1:cut])

    from edgert.cli.main import build_parser
    from edgert.cli.run import build_config
    from edgert.pipeline.runner import Pipeline

    run_args = build_parser().parse_args(["run", *sys.argv[cut + 1:]])
    config = build_config(run_args)
    leaf: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    own: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    samples = collections.Counter[str]()
    stop = threading.Event()
    me = threading.get_ident()

    def sample() -> None:
        while not stop.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, str(ident))
                samples[name] += 1
                leaf[name][_where(frame, False)] += 1
                own[name][_where(frame, True)] += 1
            time.sleep(args.interval_ms / 1000.0)

    if args.switch_ms:
        sys.setswitchinterval(args.switch_ms / 1000.0)
    sampler = threading.Thread(target=sample, name="sampler", daemon=True)
    t0 = time.perf_counter()
    if not args.no_sample:
        sampler.start()
        me = sampler.ident or 0
    summary = Pipeline(config, handle_signals=False).run()
    wall = time.perf_counter() - t0
    stop.set()
    if not args.no_sample:
        sampler.join()
    threads = {}
    for name in sorted(samples):
        n = samples[name]
        threads[name] = {
            "samples": n,
            "leaf": [(k, round(v / n, 3)) for k, v in leaf[name].most_common(args.top)],
            "edgert": [(k, round(v / n, 3)) for k, v in own[name].most_common(args.top)],
        }
    print(f"switch interval {sys.getswitchinterval() * 1000:g} ms")
    print(f"fps {summary['fps']}  frames {summary['frames']}  wall {wall:.1f} s  gpu_ms {summary.get('gpu_ms')}")
    print(f"latency_ms {json.dumps(summary['latency_ms'])}")
    for name, t in threads.items():
        print(f"\n== {name} ({t['samples']} samples)")
        for k, share in t["edgert"]:
            print(f"   {share:6.1%}  {k}")
        print("   -- innermost:")
        for k, share in t["leaf"][:4]:
            print(f"   {share:6.1%}  {k}")
    write_json(args.out, {"machine": machine_info(), "argv": sys.argv[cut + 1:], "fps": summary["fps"],
                          "switch_ms": sys.getswitchinterval() * 1000, "sampled": not args.no_sample,
                          "summary": {k: summary[k] for k in ("frames", "latency_ms", "gpu_ms", "batch", "slots")
                                      if k in summary}, "threads": threads})
    return 0


if __name__ == "__main__":
    sys.exit(main())
