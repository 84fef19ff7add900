"""INT8 measured as engine speed on a real TensorRT: per detector, FP32 / FP16 / edgert's default INT8 /
edgert --full-int8 / NVIDIA ModelOpt's INT8 (and implicit INT8 from a calibration cache where one is given),
each built once with a batch profile 1..32 tuned for 16 (``CONTEXTS`` copies, 4 unless set: the GPU processor's
slots each take one on TensorRT 8.x) and DETAILED layer information, then:

- engine latency (p50/p99 of one call) and throughput (frames/s) at batch 1, 16 and 32 (``edgert bench``'s loop);
- the layer report: compute layers by precision, float layers, reformat layers (TensorRT's engine inspector);
- agreement with FP32 on held-out images: mAP@0.5:0.95 with the FP32 ONNX's detections (ONNX Runtime CPU) as
  the ground truth (``edgert compare``'s measure, both through the runtime's preprocessing and decoding);
- (``--phase pipeline``) the same engine through ``edgert run`` with 16 file streams (frames/s end to end, against
  the engine's compute-only batch-16 figure), and ``edgert bench`` on it.

``--jobs N`` builds N engines at once, each in its own process (a build is mostly one CPU core's work; the
JSON keeps each build's CPU seconds beside its wall seconds, so a reader can tell whether they contended). Each
build row has a ``trace`` of TensorRT's verbose log: where the builder's time went, by timing runner, and its
longest silences (a build on 8.5 takes minutes with the GPU idle, and this says on what). While a build runs,
its trace so far is rewritten every 15 s to ``$OUT/trace.{model}.{variant}.json`` (or beside the engines), so a
build that outlives its device call still says where it is.

Variants come from a folder of quantized models named ``{model}-edgert.onnx``, ``{model}-edgert-full.onnx``,
``{model}-modelopt.onnx`` (and ``{model}-edgert.calib`` for implicit INT8); a missing one is left out and said.
Runs where TensorRT and a GPU are (the device machine: scripts/gpu_trt85.sh int8); on a machine without them
it exits 1 with one line. Writes JSON (``--out``) and prints one table.

    python scripts/bench_trt_int8.py --int8 DIR --heldout LIST.txt --out docs/results/trt85-int8.json
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _bench import assets_dir, machine_info, write_json

from edgert.builder.progress import timing_runner

MODELS = {"nanodet": "nanodet-m-416-coco-v8layout.onnx", "yolov8s": "yolov8s-fall-640.onnx",
          "yolov3tiny": "yolov3-tiny-coco-416.onnx"}
#: variant -> (source file name pattern, precision); "{fp32}" is the shared FP32 model
VARIANTS = {"fp32": ("{fp32}", "fp32"), "fp16": ("{fp32}", "fp16"), "int8-edgert": ("{name}-edgert.onnx", "int8"),
            "int8-edgert-full": ("{name}-edgert-full.onnx", "int8"), "int8-modelopt": ("{name}-modelopt.onnx", "int8"),
            "int8-edgert-prev": ("{name}-edgert-prev.onnx", "int8"),  # an earlier placement, when one is given
            "int8-implicit": ("{fp32}", "int8")}


def _source(name: str, variant: str, int8_dir: Path) -> tuple[Path | None, Path | None]:
    pattern, _ = VARIANTS[variant]
    fp32 = assets_dir() / "models" / "detection" / MODELS[name]
    if pattern == "{fp32}":
        if variant == "int8-implicit":
            cache = int8_dir / f"{name}-edgert.calib"
            return (fp32, cache) if cache.is_file() else (None, None)
        return fp32, None
    path = int8_dir / pattern.format(name=name)
    return (path, None) if path.is_file() else (None, None)


# profile copies: edgert run's GPU processor takes one per slot (max_gpu_slots); the builder optimizes each copy,
# so CONTEXTS=2 gives shorter builds and a two-slot pipeline
CONTEXTS = int(os.environ.get("CONTEXTS", "4"))


def build(name: str, variant: str, int8_dir: Path, engines: Path, max_batch: int, opt_batch: int,
          backend: str = "tensorrt") -> dict[str, Any]:
    from edgert.builder import parse_shapes
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.cli.bench import batch_inputs
    from edgert.rewrite.batch import batched_model_path

    src, cache = _source(name, variant, int8_dir)
    if src is None:
        return {"skipped": "no quantized model for this variant"}
    batched = batched_model_path(src)
    rest = batch_inputs(batched, [])

    def dims(n: int, r: tuple[int, ...]) -> str:
        return "x".join(str(d) for d in (n, *r))

    shapes = [f"{k}:{dims(1, r)}/{dims(opt_batch, r)}/{dims(max_batch, r)}" for k, r in rest.items()]
    out = engines / f"{name}.{variant}.engine"
    options = BuildOptions(backend=backend, precision=VARIANTS[variant][1], profiles=tuple(parse_shapes(shapes)),
                           calib_cache=cache, detailed_layers=True, contexts=CONTEXTS)
    t0, cpu0 = time.perf_counter(), _cpu_s()
    live = Path(os.environ.get("OUT", engines)) / f"trace.{name}.{variant}.json"
    with traced(live) as trace:
        result = build_engine(batched, out, options)
    return {"source": str(src), "batched": str(batched), "engine": str(result.engine), "status": result.status,
            "build_s": round(time.perf_counter() - t0, 1), "build_cpu_s": round(_cpu_s() - cpu0, 1),
            "engine_mb": round(result.record.engine_bytes / 1e6, 2), "contexts": CONTEXTS,
            "inputs": {k: list(r) for k, r in rest.items()}, "trace": trace.summary()}


class BuildTrace(logging.Handler):
    """TensorRT's verbose build log reduced as it comes: seconds per timing runner (a layer's tactic search) and
    the longest silences with the message before each. The whole log of one build is hundreds of MB."""

    def __init__(self, keep: int = 25) -> None:
        super().__init__(level=5)
        self.keep, self.lines, self.mutex = keep, 0, threading.Lock()
        self.start = self.last = self.runner_t = time.perf_counter()
        self.previous, self.runner = "(start)", "(before the first timing runner)"
        self.runners: dict[str, float] = {}
        self.silences: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        now, msg = time.perf_counter(), record.getMessage()
        with self.mutex:
            self._add(now, msg)

    def _add(self, now: float, msg: str) -> None:
        gap = now - self.last
        if len(self.silences) < self.keep:
            heapq.heappush(self.silences, (gap, self.previous[:240]))
        elif gap > self.silences[0][0]:  # most lines come within microseconds: no copy of them is kept
            heapq.heapreplace(self.silences, (gap, self.previous[:240]))
        runner = timing_runner(msg)
        if runner:
            self.runners[self.runner] = self.runners.get(self.runner, 0.0) + now - self.runner_t
            self.runner, self.runner_t = f"{runner[0][:140]} ({runner[1]})", now
        self.lines, self.last, self.previous = self.lines + 1, now, msg

    def summary(self) -> dict[str, Any]:
        with self.mutex:
            return self._summary()

    def _summary(self) -> dict[str, Any]:
        now = time.perf_counter()
        runners = dict(self.runners)
        runners[self.runner] = runners.get(self.runner, 0.0) + now - self.runner_t
        top = sorted(runners.items(), key=lambda kv: -kv[1])[:self.keep]
        return {"lines": self.lines, "seconds": round(now - self.start, 1), "timing_runners": len(runners),
                "runner_s": {k: round(v, 2) for k, v in top},
                "silences": [{"s": round(s, 2), "after": m} for s, m in sorted(self.silences, reverse=True)],
                "silent_s": round(now - self.last, 1), "last": self.previous[:400]}


@contextlib.contextmanager
def traced(live: Path | None = None, every_s: float = 15.0) -> Iterator[BuildTrace]:
    """TensorRT's verbose log (edgert routes it to the ``edgert.tensorrt`` logger) into a BuildTrace, kept from
    the console; the level is set before the build makes its logger, which asks it once. With ``live``, the
    summary is rewritten there every ``every_s`` while the build runs, so a build that outlives its device call
    still says where it is (its ``silent_s`` and ``last`` message)."""
    logger, trace = logging.getLogger("edgert.tensorrt"), BuildTrace()
    level, propagate = logger.level, logger.propagate
    logger.setLevel(5)
    logger.propagate = False
    logger.addHandler(trace)
    stop = threading.Event()

    def write() -> None:
        while not stop.wait(every_s):
            assert live is not None
            tmp = live.with_name(live.name + ".tmp")
            tmp.write_text(json.dumps(trace.summary(), indent=1))
            tmp.replace(live)

    writer = threading.Thread(target=write, daemon=True, name="build-trace")
    if live is not None:
        writer.start()
    built = False
    try:
        yield trace
        built = True
    finally:
        stop.set()
        if live is not None:
            writer.join()
            if built:  # the row's own trace replaces it; a failed build's stays beside its error
                live.unlink(missing_ok=True)
        logger.removeHandler(trace)
        logger.setLevel(level)
        logger.propagate = propagate


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


Job = tuple[str, str, Path, Path, int, int, str]  # build()'s arguments


def _build_row(job: Job) -> tuple[str, str, dict[str, Any]]:
    """One build in a worker process: the row, or the error as a row (one variant's failure ends nothing)."""
    name, variant = job[0], job[1]
    try:
        return name, variant, build(*job)
    except Exception as exc:
        return name, variant, {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}


def build_all(jobs: list[Job], workers: int, done: Any) -> None:
    """Build ``jobs`` ``workers`` at a time; ``done(name, variant, row)`` as each finishes."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    from edgert.rewrite.batch import BatchRewriteError, batched_model_path

    for name, variant, int8_dir, *_ in jobs:  # the dynamic-batch rewrites once, before the workers race for them
        src, _cache = _source(name, variant, int8_dir)
        if src is not None:
            # a refusal is cached with its reason: that variant's build row says it, the others go on
            with contextlib.suppress(BatchRewriteError):
                batched_model_path(src)
    if workers <= 1:
        for job in jobs:
            done(*_build_row(job))
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(_build_row, job) for job in jobs]):
            done(*fut.result())


def pipeline(built: dict[str, Any], video: Path, streams: int) -> dict[str, Any]:
    """``built``'s engine through ``edgert run`` with ``streams`` file streams (the CLI, as a user runs it), and
    ``edgert bench`` on the engine."""
    engine = Path(built["engine"])
    serving = Path(built["batched"]).with_suffix(".engine")  # where edgert run looks for the model's engine
    files = [(engine, serving), (engine.with_name(engine.name + ".json"), serving.with_name(serving.name + ".json"))]
    for _, dst in files:  # an engine already there (another build's) is put back after the run
        if dst.exists() and engine != serving:
            dst.replace(dst.with_name(dst.name + ".bak"))
    try:
        if engine != serving:
            for src, dst in files:
                shutil.copyfile(src, dst)
        return _run_and_bench(built, engine, video, streams)
    finally:
        for _, dst in files:
            if dst.with_name(dst.name + ".bak").exists():
                dst.with_name(dst.name + ".bak").replace(dst)


def _run_and_bench(built: dict[str, Any], engine: Path, video: Path, streams: int) -> dict[str, Any]:
    py = [sys.executable, "-m", "edgert"]
    cmd = [*py, "run", "--backend", "tensorrt", "--model", built["source"], "--json"]
    for _ in range(streams):
        cmd += ["--source", str(video)]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    shown = f"edgert run --backend tensorrt --model {built['source']} --json --source {video} (x{streams})"
    row: dict[str, Any] = {"command": shown, "rc": run.returncode,
                           "wall_s": round(time.perf_counter() - t0, 1), "stderr_tail": run.stderr[-800:]}
    if run.returncode == 0:
        summary = json.loads(run.stdout)
        row.update({k: summary.get(k) for k in ("fps", "frames", "latency_ms", "processing", "slots", "batch",
                                                "batch_fill", "wall_s", "batch_note")})
    bench = subprocess.run([*py, "bench", str(engine), "--backend", "tensorrt", "--iterations", "100", "--json"],
                           capture_output=True, text=True, timeout=300)
    row["edgert_bench_rc"] = bench.returncode
    if bench.returncode:
        row["edgert_bench_stderr"] = bench.stderr[-800:]
    return row


def measure(engine: Path, inputs: dict[str, list[int]], batches: list[int], iterations: int) -> dict[str, Any]:
    from edgert.backends import SessionOptions, get_backend
    from edgert.cli.bench import bench_session
    from edgert.engine.layers import summarize_layers

    be = get_backend("tensorrt")
    rows = []
    layers: dict[str, Any] = {}
    for b in batches:
        options = SessionOptions(shapes={k: (b, *r) for k, r in inputs.items()})
        with be.open(engine, options) as session:
            if not layers:
                layers = summarize_layers(session.layer_information()).to_json()
            res = bench_session(session, iterations, 20)
        lat = res["latency_ms"]
        rows.append({"batch": b, "p50_ms": round(lat["p50"], 3), "p99_ms": round(lat["p99"], 3),
                     "frames_per_s": round(b * res["throughput_fps"], 1),
                     "compute_p50_ms": (res.get("gpu") or {}).get("compute_ms", {}).get("p50"),
                     "compute_only_frames_per_s": round(b * (res.get("gpu") or {}).get("compute_only_fps", 0.0), 1)})
    return {"batches": rows, "layers": layers}


def agreement(reference: Path, candidate: Path, heldout: list[Path]) -> dict[str, Any]:
    """``candidate`` (an engine) against the FP32 ONNX ``reference`` on ONNX Runtime CPU: no FP32 engine to build
    first, and the same reference ``edgert calibrate`` and ``edgert compare`` use."""
    from edgert.calib.comparison import compare_detectors
    from edgert.vision.image_io import read_image

    frames = [(p.name, read_image(p)) for p in heldout]
    r = compare_detectors(reference, candidate, frames, backend="onnxruntime", candidate_backend="tensorrt")
    return {"frames": r["frames"], "map50_95": r["map"]["map50_95"], "map50": r["map"]["map50"],
            "strict_map50_95": r["map_strict"]["map50_95"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--int8", type=Path, required=True, help="folder of quantized models ({model}-edgert.onnx, ...)")
    ap.add_argument("--heldout", type=Path, help="text file: held-out image names (in the assets' images/)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batches", default="1,16,32")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--engines", type=Path, default=Path("/tmp/edgert-trt-int8"))
    ap.add_argument("--phase", choices=("build", "measure", "all", "pipeline"), default="all",
                    help="build: engines only (cached for the next phase); measure: latency, layers, agreement; "
                         "pipeline: edgert run with --streams file streams on each built engine")
    ap.add_argument("--backend", choices=("tensorrt", "tensorrt-rtx"), default="tensorrt",
                    help="tensorrt-rtx with --phase build: a dry run of the builds on a machine without a GPU")
    ap.add_argument("--jobs", type=int, default=1, help="engines built at once, each in its own process")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("trt-int8.json"))
    args = ap.parse_args()
    from edgert.backends import backend_class

    probe = backend_class(args.backend)().probe()
    dry = args.backend == "tensorrt-rtx" and args.phase == "build"  # TensorRT-RTX builds without a GPU
    if not probe.available and not dry:
        print(f"bench_trt_int8: TensorRT cannot run here: {probe.reason}", file=sys.stderr)
        return 1
    batches = [int(b) for b in args.batches.split(",")]
    args.engines.mkdir(parents=True, exist_ok=True)
    heldout = [assets_dir() / "images" / n.strip() for n in args.heldout.read_text().splitlines() if n.strip()] \
        if args.heldout else []
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    data: dict[str, Any] = {"machine": machine_info(), "trt": probe.reason, "batches": batches,
                            "profile": f"1..{max(batches)}, tuned for 16", "heldout_images": len(heldout),
                            "models": previous.get("models", {})}
    names, variants = args.models.split(","), args.variants.split(",")
    for name in names:
        data["models"].setdefault(name, {})
    if args.phase in ("build", "all"):
        def done(name: str, variant: str, row: dict[str, Any]) -> None:
            kept = data["models"][name].setdefault(variant, {})
            if not (row.get("status") == "reused" and kept.get("build", {}).get("status") in ("built", "rebuilt")):
                kept["build"] = row  # a resumed run finds the engine built: the first build's figures stay
            print(f"{name} {variant}: {row.get('error') or {k: v for k, v in row.items() if k != 'trace'}}", flush=True)
            write_json(args.out, data)

        data["build_jobs"] = args.jobs
        # variant by variant: the later builds find the earlier ones' layer timings in the timing cache
        build_all([(n, v, args.int8, args.engines, max(batches), 16, args.backend) for v in variants for n in names],
                  args.jobs, done)
    for variant in variants:  # variant by variant: a run cut short by its time limit has whole columns
        for name in names:
            rows = data["models"][name]
            row = rows.setdefault(variant, {})
            built = row.get("build", {})
            if not built.get("engine") or args.phase == "build":
                continue
            if (args.phase == "measure" and "batches" in row) or (args.phase == "pipeline" and "pipeline" in row):
                continue  # measured by an earlier run (a device run's time limit ends a phase part-way)
            try:
                if args.phase in ("measure", "all"):
                    row.update(measure(Path(built["engine"]), built["inputs"], batches, args.iterations))
                    if heldout:
                        row["agreement"] = agreement(assets_dir() / "models" / "detection" / MODELS[name],
                                                     Path(built["engine"]), heldout)
                if args.phase == "pipeline":
                    row["pipeline"] = pipeline(built, assets_dir() / "video" / "vtest.avi", args.streams)
                    print(f"{name} {variant}: edgert run {row['pipeline']}", flush=True)
            except Exception as exc:  # one variant's failure is a row, not the end of the run
                row["error"] = f"{type(exc).__name__}: {exc}"
                row["traceback"] = traceback.format_exc()[-3000:]
                print(f"{name} {variant}: FAILED {row['error']}", flush=True)
            write_json(args.out, data)
    _table(data)
    write_json(args.out, data)
    return 0


def _table(data: dict[str, Any]) -> None:
    print(f"{'model':<11}{'variant':<18}{'b1 p50':>8}{'b1 p99':>8}{'b16 f/s':>10}{'b32 f/s':>10}"
          f"{'int8':>6}{'fp16':>6}{'fp32':>6}{'refmt':>6}{'mAP':>7}")
    for name, rows in data["models"].items():
        fp16 = {r["batch"]: r for r in rows.get("fp16", {}).get("batches", [])}
        for variant, row in rows.items():
            if "batches" not in row:
                print(f"{name:<11}{variant:<18}{row.get('error') or row.get('build', {}).get('skipped', '')}")
                continue
            by = {r["batch"]: r for r in row["batches"]}
            lay = row.get("layers", {}).get("by_precision", {})
            agree = row.get("agreement", {}).get("map50_95")
            speed = ""
            if 16 in by and 16 in fp16 and variant.startswith("int8"):
                speed = f"  {by[16]['frames_per_s'] / fp16[16]['frames_per_s']:.2f}x fp16 at b16"
            print(f"{name:<11}{variant:<18}{by.get(1, {}).get('p50_ms', 0):>8.2f}{by.get(1, {}).get('p99_ms', 0):>8.2f}"
                  f"{by.get(16, {}).get('frames_per_s', 0):>10.0f}{by.get(32, {}).get('frames_per_s', 0):>10.0f}"
                  f"{lay.get('int8', 0):>6}{lay.get('fp16', 0):>6}{lay.get('fp32', 0):>6}"
                  f"{row.get('layers', {}).get('reformats', 0):>6}{'' if agree is None else f'{agree:.3f}':>7}{speed}")


if __name__ == "__main__":
    sys.exit(main())
