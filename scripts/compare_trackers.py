#!/usr/bin/env python3
"""Same tracks from edgert's ByteTrack and Roboflow's, and the same counts under NumPy 1 and NumPy 2.

1. Runs ``edgert run --track`` on vtest.avi (NanoDet, a counting line across the middle) in this
   interpreter and, with ``--np1-python``, in a venv with ``numpy<2``: the crossing counts, track counts
   and every frame's ids are compared. Those runs decode with each venv's own OpenCV and ONNX Runtime, so
   their detections can differ a little; hence also: this run's detections replayed through edgert's
   ByteTrack in the numpy-1 interpreter, which must give the very same ids.
2. Replays this run's detections (the JSONL records) through both ByteTracks, edgert's
   (:mod:`edgert.analytics.bytetrack`) and ``trackers.ByteTrackTracker`` (skipped when ``trackers`` is not
   installed), then through the same counting line: ids that differ, id switches (an edgert track whose
   ``trackers`` id changes), track counts and crossings. Writes JSON (``--out``).

    python scripts/compare_trackers.py --frames 300 --np1-python /tmp/deps-np1/bin/python \\
        --out docs/results/compare_trackers.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgert.analytics.analytics import Analytics  # noqa: E402
from edgert.analytics.tracking import Tracker  # noqa: E402
from edgert.config import AnalyticsConfig, LineConfig, TrackConfig  # noqa: E402
from edgert.vision.detections import Detections  # noqa: E402

LINE = LineConfig(name="middle", points=((0.0, 288.0), (768.0, 288.0)))


def run_cli(python: str, assets: Path, frames: int, work: Path, tag: str) -> tuple[dict[str, Any], list[Any]]:
    events = work / f"{tag}.jsonl"
    cfg = work / f"{tag}.yaml"
    cfg.write_text(
        f"model: {{path: {assets / 'models/detection/nanodet-m-416-coco-v8layout.onnx'}}}\n"
        "decode: {conf: 0.35}\n"
        f"source: {{uri: {assets / 'video/vtest.avi'}}}\n"
        "track: {keep_untracked: true}\n"  # every detection reaches the JSONL: the replay needs the untracked too
        "analytics:\n  lines:\n    - {name: middle, points: [[0, 288], [768, 288]]}\n"
        f"sinks: ['jsonl://{events}']\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    probe = subprocess.run([python, "-c", "import numpy, sys; print(numpy.__version__, sys.version.split()[0])"],
                           capture_output=True, text=True, env=env, check=True).stdout.split()
    proc = subprocess.run([python, "-m", "edgert.cli.main", "run", "--config", str(cfg), "--track",
                           "--max-frames", str(frames), "--json"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"compare_trackers: {python} failed: {proc.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(proc.stdout)
    summary["_numpy"], summary["_python"] = probe[0], probe[1]
    records = [json.loads(line) for line in events.read_text().splitlines()]
    return summary, [r for r in records if "detections" in r]


def frame_ids(frames: list[Any]) -> list[list[int]]:
    return [[int(d["track_id"]) for d in r["detections"]] for r in frames]


def replay(frames: list[Any], implementation: str, fps: float) -> dict[str, Any]:
    """Untracked detections of each frame through one ByteTrack and the line; ids kept per detection."""
    tracker = Tracker.from_config(TrackConfig(keep_untracked=True), fps, implementation=implementation)
    analytics = Analytics(AnalyticsConfig(lines=(LINE,)))
    ids: list[np.ndarray] = []
    crossings = 0
    by_id = {int(x["class_id"]): str(x["class_name"]) for r in frames for x in r["detections"]}
    names = tuple(by_id.get(i, str(i)) for i in range(max(by_id, default=-1) + 1))
    for r in frames:
        dets = r["detections"]
        d = Detections(xyxy=np.array([x["box"] for x in dets], np.float32).reshape(-1, 4),
                       confidence=np.array([x["confidence"] for x in dets], np.float32),
                       class_id=np.array([x["class_id"] for x in dets], np.int64),
                       names=names)
        tracked = tracker.update(d, int(r["frame"]))
        assert tracked.track_id is not None
        ids.append(tracked.track_id.copy())
        kept = tracked[tracked.track_id >= 0]
        crossings += len([e for e in analytics.update(kept, int(r["frame"]), float(r["frame"]) / fps)
                          if e["type"] == "line_cross"])
    return {"ids": ids, "tracks": tracker.summary()["tracks"], "crossings": crossings,
            "counts": analytics.counts()}


def id_switches(a: list[np.ndarray], b: list[np.ndarray]) -> int:
    """Times an ``a`` track's id in ``b`` changes from one frame it is seen in to the next."""
    last: dict[int, int] = {}
    switches = 0
    for fa, fb in zip(a, b):
        for ia, ib in zip(fa.tolist(), fb.tolist()):
            if ia < 0:
                continue
            if ia in last and last[ia] != ib:
                switches += 1
            last[ia] = ib
    return switches


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--assets", default=os.environ.get("EDGERT_ASSETS", str(ROOT.parent / "shared/assets")))
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--np1-python", default="", help="a python whose venv has numpy<2 and edgert's [track,cpu,opencv]")
    ap.add_argument("--out", default="")
    ap.add_argument("--replay", default="", help=argparse.SUPPRESS)  # internal: replay a frames file, print ids
    args = ap.parse_args(argv)
    if args.replay:  # run by the numpy-1 interpreter on the numpy-2 run's detections
        data = json.loads(Path(args.replay).read_text())
        got = replay(data["frames"], "edgert", data["fps"])
        print(json.dumps({"ids": [x.tolist() for x in got["ids"]], "tracks": got["tracks"],
                          "crossings": got["crossings"], "counts": got["counts"], "numpy": np.__version__}))
        return 0
    assets = Path(args.assets)
    if not (assets / "video/vtest.avi").exists():
        print(f"compare_trackers: no vtest.avi under {assets}", file=sys.stderr)
        return 2
    out: dict[str, Any] = {"frames": args.frames, "machine": platform.machine(), "video": "vtest.avi",
                           "line": "middle [[0,288],[768,288]]", "decode_conf": 0.35}
    with tempfile.TemporaryDirectory(prefix="edgert-cmp-") as tmp:
        work = Path(tmp)
        main_summary, frames = run_cli(sys.executable, assets, args.frames, work, "np2")
        src = main_summary["sources"][0]
        out["pipeline"] = {"numpy": main_summary["_numpy"], "python": main_summary["_python"],
                           "tracking": src.get("tracking"), "counts": src.get("counts")}
        if args.np1_python:
            np1_summary, np1_frames = run_cli(args.np1_python, assets, args.frames, work, "np1")
            s1 = np1_summary["sources"][0]
            out["pipeline_np1"] = {"numpy": np1_summary["_numpy"], "python": np1_summary["_python"],
                                   "tracking": s1.get("tracking"), "counts": s1.get("counts")}
            same_dets = sum(len(a["detections"]) == len(b["detections"]) for a, b in zip(frames, np1_frames))
            out["np1_vs_np2"] = {
                "same_counts": s1.get("counts") == src.get("counts"),
                "same_tracks": s1.get("tracking") == src.get("tracking"),
                "frames_with_same_ids": sum(x == y for x, y in zip(frame_ids(frames), frame_ids(np1_frames))),
                "frames_with_same_detection_count": same_dets,
            }
        fps = float(main_summary["source"].get("fps") or 30.0)
        ours = replay(frames, "edgert", fps)
        out["replay_edgert"] = {k: ours[k] for k in ("tracks", "crossings", "counts")}
        if args.np1_python:  # the same detections through edgert's ByteTrack under numpy 1
            dump = work / "frames.json"
            dump.write_text(json.dumps({"frames": frames, "fps": fps}))
            proc = subprocess.run([args.np1_python, str(Path(__file__).resolve()), "--replay", str(dump)],
                                  capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            if proc.returncode != 0:
                raise SystemExit(f"compare_trackers: replay under numpy 1 failed: {proc.stderr[-500:]}")
            np1 = json.loads(proc.stdout)
            out["replay_edgert_np1"] = {k: np1[k] for k in ("numpy", "tracks", "crossings", "counts")}
            out["replay_np1_vs_np2"] = {
                "different_ids": int(sum(int((np.asarray(a) != b).sum()) for a, b in zip(np1["ids"], ours["ids"]))),
                "same_counts": np1["counts"] == ours["counts"]}
        try:
            import trackers  # noqa: F401
        except ImportError:
            out["replay_trackers"] = "skipped: trackers is not installed (Python 3.10+, numpy 2)"
        else:
            theirs = replay(frames, "trackers", fps)
            out["replay_trackers"] = {k: theirs[k] for k in ("tracks", "crossings", "counts")}
            n = sum(len(x) for x in ours["ids"])
            out["edgert_vs_trackers"] = {
                "detections": n,
                "different_ids": int(sum(int((x != y).sum()) for x, y in zip(ours["ids"], theirs["ids"]))),
                "id_switches": id_switches(ours["ids"], theirs["ids"]),
                "same_crossings": ours["counts"] == theirs["counts"],
            }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
