#!/usr/bin/env python3
"""How close does ``edgert run`` get to plain ONNX Runtime? Measured in one run, on one machine.

For each repeat, alternating so background load hits both alike:

1. *bare*: what a user gets from plain ONNX Runtime: ``onnxruntime.InferenceSession(model)`` with its
   default options, ``session.run(None, {input: x})`` on a letterboxed frame of the video, same model and
   input size; nothing else (no video decoding, no preprocessing, no NMS);
2. *pipeline*: ``edgert.pipeline.Pipeline`` with the product's defaults, exactly what ``edgert run --model M
   --source VIDEO`` runs (processing auto -> the CPU processor here, its default slots and threads): decode the
   video live, letterbox, infer, decode boxes + NMS (no sinks unless ``--sink``);

and prints pipeline FPS / bare FPS (target >= 0.9) with the spread over repeats, plus the CPU time per frame
of each. Then:

- allocation: one more pipeline run under ``tracemalloc``: net growth of traced memory per frame after
  ``--warm`` frames (a leak shows here) and the largest transient above the steady level;
- peak RSS (``--rss``): a fresh process runs the pipeline over the video looped for ``--rss-frames`` frames
  and reports ``ru_maxrss`` after 1 000 frames and at the end (target: within 8 MB).

    .venv/bin/python scripts/bench_pipeline.py                       # nanodet on vtest.avi
    .venv/bin/python scripts/bench_pipeline.py --repeats 5 --frames 400 --rss
    .venv/bin/python scripts/bench_pipeline.py --model ../shared/assets/models/detection/yolov3-tiny-coco-416.onnx
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from _bench import RssProbe, assets_dir, machine_info, write_json

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.io.sources import open_source
from edgert.pipeline import BaseObserver, Pipeline, PipelineStats
from edgert.vision.detector import Detector


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


def plain_ort_fps(model: str, x: np.ndarray, frames: int) -> tuple[float, float]:
    """``InferenceSession(model).run`` with ONNX Runtime's default options: FPS and CPU ms per frame."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    for _ in range(5):
        sess.run(None, {name: x})
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(frames):
        sess.run(None, {name: x})
    return frames / (time.perf_counter() - started), (time.process_time() - cpu) * 1000 / frames


def pipeline_run(detector: Detector | None, config: PipelineConfig, sinks: list[str],
                 observers: list[Any] | None = None) -> dict[str, Any]:
    cpu = time.process_time()
    summary = Pipeline(config, detector=detector, sinks=sinks, observers=observers or [],
                       handle_signals=False).run()
    summary["cpu_ms_per_frame"] = (time.process_time() - cpu) * 1000 / max(1, summary["frames"])
    return summary


def rss_run(model: str, video: str, frames: int, marks: tuple[int, ...]) -> dict[str, Any]:
    """The default pipeline over the looped video; peak RSS at ``marks`` (call in a fresh process)."""
    probe = RssProbe(marks)
    config = PipelineConfig(model=ModelConfig(path=model), source=SourceConfig(uri=video, loop=True),
                            runtime=RuntimeConfig(max_frames=frames))
    summary = Pipeline(config, observers=[probe], handle_signals=False).run()
    return {"frames": summary["frames"], "fps": summary["fps"], "slots": summary["slots"],
            "peak_rss_kib": {str(k): v for k, v in sorted(probe.peak_kib.items())}}


def rss_subprocess(model: str, video: str, frames: int) -> dict[str, Any]:
    import subprocess

    # a fresh interpreter for a clean peak RSS; started in scripts/ so that it imports this module by name
    model, video = str(Path(model).resolve()), str(Path(video).resolve())
    code = (f"import json; import bench_pipeline as b; "
            f"print(json.dumps(b.rss_run({model!r}, {video!r}, {frames}, (1000, {frames}))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600,
                          cwd=Path(__file__).parent)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:]}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    peaks = out["peak_rss_kib"]
    if "1000" in peaks and str(frames) in peaks:
        out["growth_mib"] = round((peaks[str(frames)] - peaks["1000"]) / 1024, 2)
    return out


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


def measure_allocation(detector: Detector | None, config: PipelineConfig, sinks: list[str],
                       warm: int) -> dict[str, Any]:
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
    p.add_argument("--slots", type=int, default=None, help="runtime.slots for the pipeline (default: edgert's)")
    p.add_argument("--sink", action="append", default=[], help="sinks for the pipeline runs (default: none)")
    p.add_argument("--warm", type=int, default=50, help="frames before the allocation measurement starts")
    p.add_argument("--track", action="store_true",
                   help="the pipeline tracks (ByteTrack) and counts on a line across the middle (issue 14's ratio)")
    p.add_argument("--rss", action="store_true", help="also measure peak RSS over --rss-frames looped frames")
    p.add_argument("--rss-frames", type=int, default=8000)
    p.add_argument("--ort-spinning", action="store_true",
                   help="also measure raw ONNX Runtime with intra-op spin-waiting on and off")
    p.add_argument("--overhead", action="store_true",
                   help="also run the pipeline with a near-free model: how fast it can feed any engine here")
    p.add_argument("--out", default="out/bench_pipeline.json")
    args = p.parse_args()
    if not Path(args.model).is_file() or not Path(args.video).is_file():
        print(f"bench_pipeline: model or video not found ({args.model}, {args.video}); set EDGERT_ASSETS",
              file=sys.stderr)
        return 1

    results: dict[str, Any] = {"model": args.model, "video": args.video, "frames": args.frames,
                               "repeats": args.repeats, "sinks": args.sink, "machine": machine_info()}
    config = PipelineConfig(model=ModelConfig(path=args.model), source=SourceConfig(uri=args.video),
                            runtime=RuntimeConfig(max_frames=args.frames, slots=args.slots))
    if args.track:
        from edgert.config import AnalyticsConfig, LineConfig, TrackConfig

        with open_source(args.video) as src:
            w, h = src.width, src.height
        line = LineConfig(name="middle", points=((0.0, h / 2), (float(w), h / 2)))
        config = dataclasses.replace(config, track=TrackConfig(), analytics=AnalyticsConfig(lines=(line,)))
        results["track"] = True
    with Detector(args.model, PipelineConfig(model=ModelConfig(path=args.model, backend="onnxruntime"))) as det:
        x = preprocessed_frames(det, args.video, 1)[0]
    bare, piped, ratios, bare_cpu, pipe_cpu = [], [], [], [], []
    stage_p50: dict[str, list[float]] = {}
    slots = threads = None
    for _ in range(args.repeats):
        b, b_cpu = plain_ort_fps(args.model, x, args.frames)
        summary = pipeline_run(None, config, args.sink)
        slots, threads = summary["slots"], (summary["processor"] or {}).get("threads_per_slot")
        bare.append(b)
        bare_cpu.append(b_cpu)
        piped.append(summary["fps"])
        pipe_cpu.append(summary["cpu_ms_per_frame"])
        ratios.append(summary["fps"] / b)
        for stage, q in summary["latency_ms"].items():
            stage_p50.setdefault(stage, []).append(q["p50"])
        print(f"bare (plain InferenceSession.run) {b:.2f} fps, edgert pipeline {summary['fps']:.2f} fps "
              f"({summary['processing']}, {slots} slots x {threads} threads): ratio {summary['fps'] / b:.3f}",
              flush=True)
    results["default"] = {
        "slots": slots, "threads_per_slot": threads,
        "bare_fps": [round(v, 2) for v in bare], "pipeline_fps": [round(v, 2) for v in piped],
        "ratio": [round(v, 3) for v in ratios], "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
        "bare_cpu_ms_per_frame_median": round(statistics.median(bare_cpu), 2),
        "pipeline_cpu_ms_per_frame_median": round(statistics.median(pipe_cpu), 2),
        "stage_p50_ms_median": {k: round(statistics.median(v), 2) for k, v in stage_p50.items()},
    }
    d = results["default"]
    print(f"pipeline/bare ratio median {d['ratio_median']} (min {d['ratio_min']}, max {d['ratio_max']}; "
          f"target >= 0.9); CPU ms/frame bare {d['bare_cpu_ms_per_frame_median']} pipeline "
          f"{d['pipeline_cpu_ms_per_frame_median']}", flush=True)
    results["allocation"] = measure_allocation(None, config, args.sink, args.warm)
    alloc = results["allocation"]
    print(f"allocation: {alloc.get('net_bytes_per_frame')} B/frame net over {alloc.get('frames_measured')} frames, "
          f"peak {alloc.get('peak_above_steady_bytes')} B above steady state", flush=True)
    if args.rss:
        results["rss"] = rss_subprocess(args.model, args.video, args.rss_frames)
        print(f"peak RSS: {results['rss']}", flush=True)
    if args.overhead:
        results["overhead"] = overhead_run(args.video, 795, 4, args.sink)
    if args.ort_spinning:
        results["ort_spinning"] = ort_spinning_check(args.model, min(args.frames, 60))
    results["machine"]["loadavg_end"] = list(os.getloadavg())
    print(f"wrote {write_json(args.out, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
