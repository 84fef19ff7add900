"""The background build and the gate of a model update, in a process of its own at low priority.

A running pipeline with ``model.update_dir`` (:mod:`edgert.pipeline.update_door`) starts
``python -m edgert.calib.update_gate JOB.json`` for each candidate: the process lowers its own priority
(``os.nice``), so the build and the check take what the running model leaves of the CPU, and the runtime never
imports calibration or the comparison (build time and run time stay apart). It prints one JSON object a line:
``{"progress": P, "step": ...}`` while it works, then ``{"result": {...}}``.

What it does, in order:

1. INT8, only when the candidate's settings ask for it: :func:`edgert.calib.calibrate.calibrate` on the given
   image folder, or on the run's own held frames when none is given; the FP32 candidate is then the reference.
2. The candidate opens in ONNX Runtime (the CPU backend's build is the session itself; a GPU build's engine is
   built here on the device machine).
3. The gate, on the held frames (recent frames of the running pipeline):

   - agreement with the candidate's FP32 reference: ``edgert compare``'s mAP@0.5:0.95 with the reference's
     detections as ground truth (:func:`edgert.calib.comparison.compare_detectors`), at least
     ``model.update_min_map``; a candidate that is its own FP32 reference agrees by definition;
   - a class-count sanity check against the current model: the candidate's detections on the held frames within
     ``model.update_max_count_ratio`` of the current model's (a model that sees nothing, or boxes everywhere,
     where the current one sees people, is refused).

A refused candidate's result says why in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["check_counts", "main", "run_job"]


def _say(**record: Any) -> None:
    print(json.dumps(record), flush=True)


def check_counts(current: int, candidate: int, frames: int, ratio: float) -> str | None:
    """Why the candidate's detection count on the held frames is not sane against the current model's (None: it
    is). ``+1`` on both sides: a frame set where both see nothing or one box passes."""
    if current == 0 and candidate <= ratio * frames:
        return None
    r = (candidate + 1) / (current + 1)
    if r > ratio or r < 1.0 / ratio:
        return (f"class-count check: {candidate} detections on {frames} held frames where the current model found "
                f"{current} (bound: within {ratio:g}x)")
    return None


def _config(job: dict[str, Any]) -> Any:
    from edgert.config import PipelineConfig
    from edgert.config.convert import from_mapping

    return from_mapping(PipelineConfig, job.get("config") or {})


def _frames(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[k] for k in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


def _int8(candidate: str, job: dict[str, Any], frames: list[np.ndarray], config: Any, out: Path) -> str:
    from edgert.calib.calibrate import CalibrationOptions, calibrate

    images = job.get("images")
    folder: Path | None = None
    if not images:  # the device's own recent frames
        import cv2

        folder = Path(tempfile.mkdtemp(prefix="frames-", dir=out))
        for i, frame in enumerate(frames):
            cv2.imwrite(str(folder / f"{i:04d}.png"), frame)
        images = str(folder)
    target = out / (Path(candidate).stem + ".int8.onnx")
    try:
        calibrate(candidate, images, target, config, CalibrationOptions(), progress=False)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return str(target)


def _engine(candidate: str, job: dict[str, Any], result: dict[str, Any]) -> str | None:
    """``edgert build`` of the candidate where the runtime looks for its engine (the runtime never builds):
    ``MODEL.engine`` beside it, or for a run of N frames a call (several sources) the ``--batch N`` engine beside
    its dynamic-batch copy, as the running engine was built; in this low-priority process. None and ``result``
    says why on failure."""
    import subprocess

    from edgert.builder.progress import progress_percent

    _say(progress=20, step="building engine")
    batch = int(job.get("batch") or 1)
    argv = [sys.executable, "-m", "edgert.cli.main", "build", candidate, "--backend", str(job["backend"]),
            "--precision", "int8" if job.get("precision") == "int8" else str(job.get("engine_precision", "fp16")),
            "--progress", "--json"]
    argv += ["--batch", str(batch)] if batch > 1 else ["-o", str(Path(candidate).with_suffix(".engine"))]
    # the build's progress lines (stderr is no terminal here) move this job from 20 to 40 %; its other stderr
    # lines are kept for the reason of a failure. stdout holds one JSON line, read once stderr has closed.
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    for line in child.stderr or ():
        pct = progress_percent(line)
        if pct is not None:
            _say(progress=20 + pct // 5, step="building engine")
        elif line.strip():
            said = [*said[-9:], line.rstrip()]
    out = child.stdout.read() if child.stdout else ""
    if child.wait() != 0:
        result.update(ok=False, why=f"the engine build failed: {' '.join(said[-1:])[:300]}")
        return None
    engine = str(json.loads(out)["engine"])
    result["engine"] = engine
    return engine


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """The build and the gate of one candidate; the result (``ok``, ``why``, the figures)."""
    from edgert.calib.comparison import compare_detectors
    from edgert.vision.detector import Detector

    t0 = time.perf_counter()
    out = Path(job["out"])
    config = _config(job)
    frames = _frames(job["frames"])
    candidate = str(job["candidate"])
    reference = job.get("reference")
    result: dict[str, Any] = {"candidate": candidate, "frames": len(frames), "precision": job.get("precision", "fp32")}
    if job.get("precision") == "int8":
        _say(progress=10, step="calibrating")
        reference = candidate
        candidate = _int8(candidate, job, frames, config, out)
    result["built"] = candidate
    engine = _engine(candidate, job, result) if job.get("builds_engines") else None
    if job.get("builds_engines") and engine is None:
        return result
    _say(progress=40, step="opening")
    counts: dict[str, int] = {}
    with Detector(candidate, config, backend="onnxruntime") as det:  # the CPU: the running model keeps the GPU
        names = tuple(det.names)
        for frame in frames:
            for name, n in det(frame).counts().items():
                counts[name] = counts.get(name, 0) + n
    result["classes"] = len(names)
    current = sum(int(n) for held in job.get("counts", []) for n in held.values())
    found = sum(counts.values())
    result["detections"] = {"current": current, "candidate": found}
    _say(progress=60, step="checking")
    if engine is not None:  # what runs is the engine: it is what must agree with the FP32 ONNX
        reference, candidate = reference or candidate, engine
    if reference and str(reference) != candidate:
        report = compare_detectors(reference, candidate, [(str(i), f) for i, f in enumerate(frames)], config,
                                   candidate_backend=job.get("backend") if engine is not None else None)
        result["map50_95"] = report["map"]["map50_95"]
        result["reference"] = str(reference)
        if result["map50_95"] < float(job["min_map"]):
            result.update(ok=False, why=f"mAP@0.5:0.95 {result['map50_95']:.3f} against its FP32 reference on "
                                        f"{len(frames)} held frames (bound {float(job['min_map']):g})")
    else:
        result["map50_95"] = 1.0  # it is its own FP32 reference
        result["reference"] = "itself (FP32)"
    if "ok" not in result:
        why = check_counts(current, found, len(frames), float(job["max_count_ratio"]))
        result.update(ok=why is None, why=why)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m edgert.calib.update_gate JOB.json", file=sys.stderr)
        return 2
    try:
        os.nice(int(os.environ.get("EDGERT_UPDATE_NICE", "19")))  # behind the running model, on every core
    except (OSError, ValueError) as exc:  # the build still runs, at the running model's priority: say so
        print(json.dumps({"warning": f"cannot lower the build's priority: {exc}"}), flush=True)
    job = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    try:
        result = run_job(job)
    except Exception as exc:  # any failure of the candidate is a rejection, said in one line
        from edgert.errors import first_line

        result = {"ok": False, "why": f"{type(exc).__name__}: {first_line(exc)}", "candidate": job.get("candidate")}
    _say(result=result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
