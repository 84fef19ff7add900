#!/usr/bin/env python3
"""How close does the full pipeline get to the bare engine? Measured in one run, on one session.

For each ONNX Runtime thread count asked for (``--threads 0,1,2``) and each repeat:

1. *bare*: ``session.infer()`` on frames of the video that were preprocessed beforehand (the input
   copied into the session's buffer with ``np.copyto`` before each call, as the pipeline's infer stage
   does): the most the engine can do with this model here;
2. *pipeline*: ``edgert.pipeline.Pipeline`` on the same session (same model, same threads): decode the
   video, preprocess, infer, decode boxes + NMS, in four threads (no sinks unless ``--sink``);

and prints pipeline FPS / bare FPS (target >= 0.9). Bare and pipeline runs alternate, so background
load hits both alike; the spread over repeats is reported. The CPU time per frame of each (all threads
of the process) shows what the pipeline adds independently of other load on the machine.

Then one more pipeline run under ``tracemalloc`` measures Python allocation in steady state: the net
growth of traced memory per frame between frame ``--warm`` and the last frame (a leak or a growing
buffer shows here), and the peak above that steady level (the largest transient, e.g. a frame copy).

    .venv/bin/python scripts/bench_pipeline.py                       # nanodet on vtest.avi
    .venv/bin/python scripts/bench_pipeline.py --threads 1,2 --repeats 5 --frames 400
    .venv/bin/python scripts/bench_pipeline.py --model ../shared/assets/models/detection/yolov3-tiny-coco-416.onnx
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig  # noqa: E402
from edgert.pipeline import BaseObserver, Pipeline, PipelineStats  # noqa: E402
from edgert.vision.detector import Detector  # noqa: E402
from edgert.vision.sources import open_source  # noqa: E402


def assets_dir() -> Path:
    return Path(os.environ.get("EDGERT_ASSETS", ROOT.parent / "shared" / "assets"))


def preprocessed_frames(detector: Detector, video: str, count: int) -> list[np.ndarray]:
    frames = []
    with open_source(video) as source:
        for _ in range(count):
            frame = source.read()
            if frame is None:
                break
            buf = np.zeros_like(detector.session.inputs[detector.input_name])
            detector.preprocessor(frame, buf)
            frames.append(buf)
    return frames


def bare_fps(detector: Detector, inputs: list[np.ndarray], frames: int) -> tuple[float, float]:
    """Frames per second, and CPU milliseconds per frame (all threads of this process)."""
    session = detector.session
    target = session.inputs[detector.input_name]
    for i in range(5):  # warm-up
        np.copyto(target, inputs[i % len(inputs)])
        session.infer()
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(frames):
        np.copyto(target, inputs[i % len(inputs)])
        session.infer()
    return frames / (time.perf_counter() - started), (time.process_time() - cpu) * 1000 / frames


def pipeline_run(detector: Detector, config: PipelineConfig, sinks: list[str],
                 observers: list[Any] | None = None) -> dict[str, Any]:
    cpu = time.process_time()
    summary = Pipeline(config, detector=detector, sinks=sinks, observers=observers or [],
                       handle_signals=False).run()
    summary["cpu_ms_per_frame"] = (time.process_time() - cpu) * 1000 / max(1, summary["frames"])
    return summary


class AllocationProbe(BaseObserver):
    """Traced Python memory at frame ``warm`` and at the end (on_frame runs on the pipeline's thread)."""

    def __init__(self, warm: int) -> None:
        self.warm = warm
        self.start: tuple[int, int] | None = None
        self.last: tuple[int, int] | None = None
        self.peak_after_warm = 0

    def on_frame(self, stats: PipelineStats) -> None:
        if stats.frames == self.warm:
            tracemalloc.reset_peak()
            self.start = (stats.frames, tracemalloc.get_traced_memory()[0])
        elif self.start is not None:
            current, peak = tracemalloc.get_traced_memory()
            self.last = (stats.frames, current)
            self.peak_after_warm = max(self.peak_after_warm, peak)


def measure_allocation(detector: Detector, config: PipelineConfig, sinks: list[str], warm: int) -> dict[str, Any]:
    probe = AllocationProbe(warm)
    tracemalloc.start()
    try:
        summary = pipeline_run(detector, config, sinks, [probe])
    finally:
        tracemalloc.stop()
    if probe.start is None or probe.last is None or probe.last[0] <= probe.start[0]:
        return {"error": "too few frames for a steady state"}
    frames = probe.last[0] - probe.start[0]
    net = probe.last[1] - probe.start[1]
    return {
        "frames_measured": frames,
        "net_bytes_per_frame": round(net / frames, 1),
        "net_bytes_total": net,
        "peak_above_steady_bytes": probe.peak_after_warm - probe.start[1],
        "fps_under_tracemalloc": summary["fps"],
    }


def ort_spinning_check(model: str, frames: int) -> list[dict[str, Any]]:
    """Raw ONNX Runtime (not edgert's session): intra-op threads x spin-waiting on/off, bare FPS and CPU/frame.

    ONNX Runtime's intra-op workers spin-wait between operators by default. On a small CPU that also runs
    the pipeline's threads (and anything else), the spinning burns the cycles the other work needs.
    """
    import onnxruntime as ort

    rows = []
    for threads in (1, 2):
        for spin in (True, False):
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.log_severity_level = 3
            so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            spec = sess.get_inputs()[0]
            x = np.random.default_rng(0).random([d if isinstance(d, int) else 1 for d in spec.shape], np.float32)
            for _ in range(3):
                sess.run(None, {spec.name: x})
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(frames):
                sess.run(None, {spec.name: x})
            rows.append({"threads": threads, "spinning": spin,
                         "fps": round(frames / (time.perf_counter() - wall), 2),
                         "cpu_ms_per_frame": round((time.process_time() - cpu) * 1000 / frames, 2)})
            print(f"raw onnxruntime threads={threads} spinning={spin}: {rows[-1]['fps']} fps, "
                  f"{rows[-1]['cpu_ms_per_frame']} CPU ms/frame", flush=True)
    return rows


def trivial_detector(path: Path, size: int = 416, classes: int = 80) -> Path:
    """A detector that costs almost nothing (average pool + 1x1 conv), YOLOv8 layout [1,4+C,N]: with it
    the pipeline runs as fast as capture, preprocessing and postprocessing allow."""
    import onnx
    from onnx import TensorProto, helper

    ch, cells = 4 + classes, (size // 32) ** 2
    bias = np.zeros(ch, np.float32)
    bias[:5] = (size / 2, size / 2, size / 4, size / 4, 0.9)  # one box, class 0, everywhere
    graph = helper.make_graph(
        [helper.make_node("AveragePool", ["images"], ["p"], kernel_shape=[32, 32], strides=[32, 32]),
         helper.make_node("Conv", ["p", "w", "b"], ["c"], kernel_shape=[1, 1]),
         helper.make_node("Reshape", ["c", "shape"], ["output0"])],
        "trivial",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, ch, cells])],
        [helper.make_tensor("w", TensorProto.FLOAT, [ch, 3, 1, 1], np.zeros(ch * 3, np.float32)),
         helper.make_tensor("b", TensorProto.FLOAT, [ch], bias),
         helper.make_tensor("shape", TensorProto.INT64, [3], np.array([1, ch, cells], np.int64))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def overhead_run(video: str, frames: int, queue_size: int, sinks: list[str]) -> dict[str, Any]:
    """The pipeline with a near-free engine: the most frames per second it can feed an engine here."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = trivial_detector(Path(tmp) / "trivial.onnx")
        config = PipelineConfig(model=ModelConfig(path=str(model), threads=1), source=SourceConfig(uri=video),
                                runtime=RuntimeConfig(max_frames=frames, queue_size=queue_size))
        with Detector(str(model), config) as detector:
            bare, _ = bare_fps(detector, preprocessed_frames(detector, video, 16), frames)
            summary = pipeline_run(detector, config, sinks)
    out = {"engine_alone_fps": round(bare, 1), "pipeline_fps": summary["fps"],
           "cpu_ms_per_frame": round(summary["cpu_ms_per_frame"], 2), "drops": summary["drops"],
           "stage_p50_ms": {k: v["p50"] for k, v in summary["latency_ms"].items()}}
    print(f"overhead (near-free engine, {frames} frames): engine alone {out['engine_alone_fps']} fps, pipeline "
          f"{out['pipeline_fps']} fps, {out['cpu_ms_per_frame']} CPU ms/frame, drops {out['drops']}; "
          f"stage p50 ms {out['stage_p50_ms']}",
          flush=True)
    return out


def main() -> int:
    assets = assets_dir()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(assets / "models/detection/nanodet-m-416-coco-v8layout.onnx"))
    p.add_argument("--video", default=str(assets / "video/vtest.avi"))
    p.add_argument("--frames", type=int, default=300, help="frames per measurement (the video has 795)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", default="0,1,2", help="ONNX Runtime intra-op threads to try (0: its default)")
    p.add_argument("--queue-size", type=int, default=4, help="frames in flight (runtime.queue_size)")
    p.add_argument("--sink", action="append", default=[], help="sinks for the pipeline runs (default: none)")
    p.add_argument("--warm", type=int, default=50, help="frames before the allocation measurement starts")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="sys.setswitchinterval (seconds) for the whole run; default: Python's 0.005")
    p.add_argument("--ort-spinning", action="store_true",
                   help="also measure raw ONNX Runtime with intra-op spin-waiting on and off")
    p.add_argument("--overhead", action="store_true",
                   help="also run the pipeline with a near-free model: how fast it can feed any engine here")
    p.add_argument("--out", default="out/bench_pipeline.json")
    args = p.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if not Path(args.model).is_file() or not Path(args.video).is_file():
        print(f"bench_pipeline: model or video not found ({args.model}, {args.video}); set EDGERT_ASSETS",
              file=sys.stderr)
        return 1

    results: dict[str, Any] = {
        "model": args.model, "video": args.video, "frames": args.frames, "repeats": args.repeats,
        "queue_size": args.queue_size, "sinks": args.sink, "switch_interval_s": sys.getswitchinterval(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "processor": platform.processor(),
                    "loadavg_start": list(os.getloadavg())},
        "settings": [],
    }
    best: dict[str, Any] | None = None
    for threads in [int(t) for t in args.threads.split(",")]:
        config = PipelineConfig(
            model=ModelConfig(path=args.model, threads=threads),
            source=SourceConfig(uri=args.video),
            runtime=RuntimeConfig(max_frames=args.frames, queue_size=args.queue_size, warmup=5),
        )
        with Detector(args.model, config) as detector:
            inputs = preprocessed_frames(detector, args.video, 16)
            bare, piped, ratios, bare_cpu, pipe_cpu = [], [], [], [], []
            stage_p50: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                b, b_cpu = bare_fps(detector, inputs, args.frames)
                summary = pipeline_run(detector, config, args.sink)
                bare.append(b)
                bare_cpu.append(b_cpu)
                pipe_cpu.append(summary["cpu_ms_per_frame"])
                piped.append(summary["fps"])
                ratios.append(summary["fps"] / b)
                for stage, q in summary["latency_ms"].items():
                    stage_p50.setdefault(stage, []).append(q["p50"])
            entry = {
                "threads": threads,
                "bare_fps": [round(x, 2) for x in bare],
                "pipeline_fps": [round(x, 2) for x in piped],
                "ratio": [round(x, 3) for x in ratios],
                "ratio_median": round(statistics.median(ratios), 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
                "bare_fps_median": round(statistics.median(bare), 2),
                "pipeline_fps_median": round(statistics.median(piped), 2),
                "stage_p50_ms_median": {k: round(statistics.median(v), 2) for k, v in stage_p50.items()},
                # CPU time is what the pipeline adds, whatever else the machine is doing (FPS is not).
                "bare_cpu_ms_per_frame_median": round(statistics.median(bare_cpu), 2),
                "pipeline_cpu_ms_per_frame_median": round(statistics.median(pipe_cpu), 2),
            }
            results["settings"].append(entry)
            print(f"threads={threads}: bare {entry['bare_fps']} fps, pipeline {entry['pipeline_fps']} fps, "
                  f"ratio median {entry['ratio_median']} (min {entry['ratio_min']}, max {entry['ratio_max']}); "
                  f"CPU ms/frame bare {entry['bare_cpu_ms_per_frame_median']} pipeline "
                  f"{entry['pipeline_cpu_ms_per_frame_median']}; stage p50 ms {entry['stage_p50_ms_median']}",
                  flush=True)
            if best is None or entry["pipeline_fps_median"] > best["pipeline_fps_median"]:
                best = entry
                results["allocation"] = measure_allocation(detector, config, args.sink, args.warm)
                results["allocation"]["threads"] = threads

    if args.overhead:
        results["overhead"] = overhead_run(args.video, 795, args.queue_size, args.sink)
    if args.ort_spinning:
        results["ort_spinning"] = ort_spinning_check(args.model, min(args.frames, 60))
    assert best is not None
    results["best"] = {"threads": best["threads"], "pipeline_fps": best["pipeline_fps_median"],
                       "bare_fps": best["bare_fps_median"], "ratio": best["ratio_median"]}
    results["machine"]["loadavg_end"] = list(os.getloadavg())
    alloc = results["allocation"]
    print(f"best: threads={best['threads']}: pipeline {best['pipeline_fps_median']} fps vs bare "
          f"{best['bare_fps_median']} fps, ratio {best['ratio_median']} (target >= 0.9)")
    print(f"allocation (threads={alloc.get('threads')}): {alloc.get('net_bytes_per_frame')} B/frame net over "
          f"{alloc.get('frames_measured')} frames, peak {alloc.get('peak_above_steady_bytes')} B above steady state")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
