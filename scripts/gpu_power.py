"""Power on the GPU machine: NVML watts and mJ/frame for a detector, then runs under a power budget.

Phases, each written to the JSON file as soon as it ends (a run cut short keeps what it measured):

1. ``idle``: the meter alone for ``--idle-s`` seconds, no inference.
2. ``unconstrained``: the detector as fast as it goes (``session.infer()`` in a loop) for ``--max-s``
   seconds: average and peak watts, joules, mJ/frame, frames per second.
3. ``bench``: ``edgert bench MODEL --backend B --power --json`` through the real CLI (a subprocess).
4. ``budget``: for each ``--levels`` fraction L, a budget of ``idle + L * (unconstrained - idle)``
   watts, and ``--budget-s`` seconds of ``admit(); session.infer()`` under
   :class:`edgert.power.BudgetController`; measured over the part after ``--settle-s``: average watts
   (energy counter when the meter has one), frames per second, fraction of time over budget, and
   whether the run settled at or under the budget.

Workload: ``--backend onnxruntime-cuda`` (ONNX Runtime's CUDA provider with pycuda buffers) on the first
detector found under $EDGERT_ASSETS (or ``--model``); without the assets a synthetic convolution model
is generated; if the ONNX Runtime CUDA backend cannot run, a torch convolution stack on the GPU stands
in (the JSON says which). ``--simulate`` runs everything on this machine against
:class:`edgert.power.SimulatedBoard` and the CPU backend, to test the script itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _bench import ROOT, assets_dir, machine_info

from edgert.power import BudgetController, PowerSampler, SimulatedBoard, open_meter
from edgert.power.meter import PowerMeter
from edgert.power.sampler import Sample

log = logging.getLogger("gpu_power")

DETECTORS = (
    "models/detection/yolov8s-fall-640.onnx",
    "models/detection/nanodet-m-416-coco-v8layout.onnx",
    "models/detection/yolov3-tiny-coco-416.onnx",
)


def find_model(explicit: str | None) -> Path | None:
    if explicit and explicit != "auto":
        return Path(explicit)
    roots = [os.environ.get("EDGERT_ASSETS", ""), "/tmp/edgert-assets", "/tmp/edgert-gp-assets",
             str(assets_dir())]
    for root in roots:
        for rel in DETECTORS:
            if root and (Path(root) / rel).is_file():
                return Path(root) / rel
    return None


def synthetic_model(path: Path, size: int = 320, width: int = 64, depth: int = 8) -> Path:
    """A plain convolution stack (conv 3x3 + relu, ``depth`` times) with an image-sized input."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev, ch = "images", 3
    for i in range(depth):
        w = (rng.standard_normal((width, ch, 3, 3)) * (2.0 / (ch * 9)) ** 0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1],
                                      strides=[2, 2] if i == 0 else [1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        prev, ch = f"r{i}", width
    nodes.append(helper.make_node("ReduceMean", [prev], ["output0"], axes=[2, 3], keepdims=0))
    graph = helper.make_graph(
        nodes, "synthetic_convs",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


class Workload:
    """One frame of work per ``step()``; ``close()`` frees it."""

    def __init__(self, step: Callable[[], None], describe: dict[str, Any], close: Callable[[], None]) -> None:
        self.step = step
        self.describe = describe
        self.close = close


def edgert_workload(model: Path, backend: str) -> Workload:
    import numpy as np

    from edgert.backends import open_session

    session = open_session(model, backend)
    rng = np.random.default_rng(0)
    for buf in session.inputs.values():
        buf[...] = rng.random(buf.shape).astype(buf.dtype) if np.issubdtype(buf.dtype, np.floating) else 1
    for _ in range(20):
        session.infer()

    def step() -> None:
        session.infer()

    describe = {"kind": "edgert session", "backend": session.backend_name, "model": str(model),
                "inputs": {k: list(v.shape) for k, v in session.inputs.items()}}
    return Workload(step, describe, session.close)


def torch_workload(reason: str) -> Workload:
    import torch  # type: ignore[import-not-found, unused-ignore]

    dev = torch.device("cuda")
    layers: list[Any] = [torch.nn.Conv2d(3, 64, 3, 2, 1), torch.nn.ReLU()]
    for _ in range(7):
        layers += [torch.nn.Conv2d(64, 64, 3, 1, 1), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers).to(dev).eval()
    x = torch.rand(1, 3, 640, 640, device=dev)

    def step() -> None:
        with torch.no_grad():
            net(x)
        torch.cuda.synchronize()

    for _ in range(20):
        step()
    return Workload(step, {"kind": "torch conv stack 8x64ch on 1x3x640x640 (stand-in)", "why": reason},
                    lambda: None)


def timed(sampler_meter: PowerMeter, hz: float, seconds: float, step: Callable[[], None] | None,
          extra: Callable[[], None] | None = None) -> dict[str, Any]:
    with PowerSampler(sampler_meter, hz=hz) as s:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if step is None:
                time.sleep(0.05)
                continue
            step()
            if extra is not None:
                extra()
            s.frame_done()
    return s.summary()


def window_figures(samples: list[Sample], t_from: float, meter: PowerMeter) -> dict[str, Any]:
    win = [x for x in samples if x.reading.time >= t_from]
    if len(win) < 2:
        return {"samples": len(win)}
    t0, t1 = win[0].reading.time, win[-1].reading.time
    dur = t1 - t0
    frames = win[-1].frames - win[0].frames
    rails = meter.total_rails
    counters = all(r in win[0].reading.energy_j and r in win[-1].reading.energy_j for r in rails)
    if counters and dur > 0:
        energy = sum(win[-1].reading.energy_j[r] - win[0].reading.energy_j[r] for r in rails)
        avg = energy / dur
        source = "energy counter"
    else:
        avg = statistics.fmean(x.reading.total_w for x in win)
        energy = avg * dur
        source = "mean of samples"
    return {
        "seconds": dur, "samples": len(win), "avg_w": avg, "avg_source": source,
        "sample_mean_w": statistics.fmean(x.reading.total_w for x in win),
        "max_sample_w": max(x.reading.total_w for x in win),
        "frames": frames, "fps": frames / dur if dur > 0 else None,
        "mj_per_frame": energy * 1000 / frames if frames else None,
    }


def settle_time(samples: list[Sample], budget: float, t_start: float, window_s: float = 5.0) -> float | None:
    """Seconds from ``t_start`` after which the ``window_s`` moving average stays within 5 % of ``budget``."""
    times = [x.reading.time for x in samples]
    watts = [x.reading.total_w for x in samples]
    ok_since: float | None = None
    lo = 0
    total = 0.0
    for i, (t, w) in enumerate(zip(times, watts)):
        total += w
        while times[lo] < t - window_s:
            total -= watts[lo]
            lo += 1
        if t - t_start < window_s:
            continue
        avg = total / (i - lo + 1)
        if abs(avg - budget) <= 0.05 * budget:
            if ok_since is None:
                ok_since = t
        else:
            ok_since = None
    return None if ok_since is None else round(ok_since - t_start, 1)


def run_bench_cli(model: Path, backend: str, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "edgert.cli.main", "bench", str(model), "--backend", backend,
           "--duration", str(seconds), "--warmup", "50", "--json", "--power"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=ROOT)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"command": " ".join(cmd), "error": str(exc)}
    out: dict[str, Any] = {"command": " ".join(cmd[1:]), "exit": r.returncode}
    try:
        out["result"] = json.loads(r.stdout)
    except json.JSONDecodeError:
        out["stdout_tail"] = r.stdout[-2000:]
        out["stderr_tail"] = r.stderr[-2000:]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="gpu_power.json")
    p.add_argument("--model", default="auto", help="ONNX detector (default: first found in the assets)")
    p.add_argument("--backend", default="onnxruntime-cuda")
    p.add_argument("--meter", default="nvml", help="nvml (default), auto, or any edgert meter name")
    p.add_argument("--hz", type=float, default=10.0, help="power sample rate")
    p.add_argument("--idle-s", type=float, default=5.0)
    p.add_argument("--max-s", type=float, default=15.0)
    p.add_argument("--bench-s", type=float, default=8.0, help="edgert bench --duration (0: skip the CLI bench)")
    p.add_argument("--levels", default="0.4,0.7", help="budgets as fractions of the idle..unconstrained range")
    p.add_argument("--budget-s", type=float, default=40.0)
    p.add_argument("--settle-s", type=float, default=20.0)
    p.add_argument("--simulate", action="store_true", help="CPU dry run: simulated board + CPU backend")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "script": "scripts/gpu_power.py", "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0], "machine": machine_info(), "simulated": args.simulate,
    }

    def save() -> None:
        out_path.write_text(json.dumps(report, indent=2, default=str))

    board: SimulatedBoard | None = None
    try:
        if args.simulate:
            board = SimulatedBoard(idle_w=3.0, joules_per_frame=0.05, max_fps=200.0, lag_s=0.3, noise_w=0.05)
            meter: PowerMeter = board
            backend = "onnxruntime"
        else:
            meter = open_meter(args.meter)
            backend = args.backend
        report["meter"] = meter.info()
        if not meter.available:
            report["error"] = f"no power meter: {meter.description}"
            save()
            print(report["error"])
            return 1
        print(f"meter: {meter.description}")

        tmpdir = Path(tempfile.mkdtemp(prefix="gpu_power_"))
        model = find_model(args.model) if not (args.simulate and args.model == "auto") else None
        if model is None:
            model = synthetic_model(tmpdir / "synthetic_convs.onnx", size=96 if args.simulate else 320,
                                    width=16 if args.simulate else 64)
            report["model_note"] = ("synthetic convolution model (simulation)" if args.simulate else
                                    "no detector in the assets: a synthetic convolution model stands in")
        try:
            work = edgert_workload(model, backend)
        except Exception as exc:  # any failure to open the GPU backend: record it and use the stand-in
            if args.simulate:
                raise
            reason = f"{backend} on {model.name}: {type(exc).__name__}: {exc}"
            print(f"workload: {reason}; using torch instead")
            work = torch_workload(reason)
        report["workload"] = work.describe
        print(f"workload: {work.describe}")
        save()
        extra = board.process_frame if board is not None else None

        # 1. idle
        idle = timed(meter, args.hz, args.idle_s, None)
        report["idle"] = idle
        save()
        print(f"idle: {idle['avg_w']:.1f} W over {idle['duration_s']:.1f} s")

        # 2. unconstrained
        full = timed(meter, args.hz, args.max_s, work.step, extra)
        report["unconstrained"] = full
        save()
        print(f"unconstrained: {full['avg_w']:.1f} W avg, {full['peak_w']:.1f} W peak, {full.get('fps', 0):.0f} fps, "
              f"{full['mj_per_frame']:.1f} mJ/frame")

        # 3. the CLI
        if args.bench_s > 0 and not args.simulate:
            report["bench_cli"] = run_bench_cli(model, backend, args.bench_s) if work.describe.get(
                "kind") == "edgert session" else {"skipped": "the edgert backend could not run here"}
            save()

        # 4. budgets
        report["budget_runs"] = []
        idle_w, max_w = idle["avg_w"], full["avg_w"]
        for level in [float(x) for x in args.levels.split(",") if x.strip()]:
            budget = idle_w + level * (max_w - idle_w)
            # Start at half the rate a straight line from idle to unconstrained predicts: under budget
            # from the first frame, and the controller finds the rest.
            start_fps = max(1.0, 0.5 * level * (full.get("fps") or 2.0))
            ctl = BudgetController(meter, budget, sample_hz=args.hz, start_fps=start_fps)
            t_start = meter.clock.now()
            end = time.monotonic() + args.budget_s
            with ctl:
                while time.monotonic() < end:
                    ctl.admit()
                    work.step()
                    if extra is not None:
                        extra()
            stats = ctl.stats()
            win = window_figures(ctl.sampler.samples(), t_start + args.settle_s, meter)
            run = {
                "level": level, "budget_w": budget, "start_fps": start_fps, "settle_s": args.settle_s,
                "seconds": args.budget_s,
                "after_settling": win, "controller": stats,
                "settle_time_s": settle_time(ctl.sampler.samples(), budget, t_start),
                "settled_under_budget": bool(win.get("avg_w") is not None and win["avg_w"] <= budget),
                "within_5_percent": bool(win.get("avg_w") is not None and abs(win["avg_w"] - budget) <= 0.05 * budget),
                "fps_vs_unconstrained": (win.get("fps") or 0) / full["fps"] if full.get("fps") else None,
                "series": [(round(x.reading.time - t_start, 2), round(x.reading.total_w, 2), x.frames)
                           for x in ctl.sampler.samples()[:: max(1, int(args.hz // 2))]],
            }
            report["budget_runs"].append(run)
            save()
            print(f"budget {budget:.1f} W (level {level}): after {args.settle_s:g} s "
                  f"{win.get('avg_w', float('nan')):.1f} W "
                  f"({win.get('avg_source')}), {win.get('fps') or 0:.0f} fps, over budget "
                  f"{(stats['over_budget_fraction'] or 0) * 100:.1f}% of the time, settled after "
                  f"{run['settle_time_s']} s -> "
                  f"{'UNDER' if run['settled_under_budget'] else 'OVER'} budget")
        work.close()
        meter.close()
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        save()
        print(f"wrote {out_path}")
        return 0
    except Exception as exc:  # the device run is one-shot: keep the partial report and the reason
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()
        save()
        print(f"gpu_power: failed: {report['error']} (partial results in {out_path})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
