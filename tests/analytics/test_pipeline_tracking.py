"""Tracking and counting through the one pipeline and the real CLI, on the real vtest.avi with NanoDet.

The issue's check: with --track and a counting line across the middle of the frame, every detection that
reaches the sinks has a track_id, tracks are long (mean >= 10 frames), crossing events appear in the JSONL as
their own records and the counts appear in the summary. Skips without the assets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("cv2")


def test_track_and_count_on_vtest(assets: Path, tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    cfg = tmp_path / "count.yaml"
    cfg.write_text(
        f"model: {{path: {assets / 'models/detection/nanodet-m-416-coco-v8layout.onnx'}}}\n"
        "decode: {conf: 0.35}\n"
        f"source: {{uri: {assets / 'video/vtest.avi'}}}\n"
        "analytics:\n  lines:\n    - {name: middle, points: [[0, 288], [768, 288]]}\n"
        "  zones:\n    - {name: lower, polygon: [[0, 288], [768, 288], [768, 576], [0, 576]]}\n"
        f"sinks: ['jsonl://{events}']\n")
    proc = subprocess.run([sys.executable, "-m", "edgert.cli.main", "run", "--config", str(cfg), "--track",
                           "--max-frames", "300", "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    records = [json.loads(line) for line in events.read_text().splitlines()]
    frames = [r for r in records if "detections" in r]
    crossings = [r for r in records if r.get("type") == "line_cross"]
    assert len(frames) == summary["frames"] == 300
    boxes = [d for r in frames for d in r["detections"]]
    assert boxes and all(isinstance(d.get("track_id"), int) and d["track_id"] >= 0 for d in boxes)
    lengths: dict[int, int] = {}
    for d in boxes:
        lengths[d["track_id"]] = lengths.get(d["track_id"], 0) + 1
    assert sum(lengths.values()) / len(lengths) >= 10
    assert crossings and all(c["line"] == "middle" and c["direction"] in ("in", "out") for c in crossings)
    counted = summary["counts"]["middle"]
    total = sum(v.get("in", 0) + v.get("out", 0) for v in counted.values())
    assert total == len(crossings)
    assert summary["tracking"]
