"""The first numbers agree: ``edgert demo`` and ``edgert run`` on the same model and clip find the same boxes
(one set of thresholds, named in the summary); one image reports no frame rate; the demo says when it
replaces an earlier video."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_cli

pytest.importorskip("onnxruntime")


def test_demo_and_run_agree_and_name_their_thresholds(tmp_path: Path) -> None:
    from edgert.cli.demo import demo_inputs

    model, video, _ = demo_inputs()
    demo = run_cli("demo", "--max-frames", "6", "--json", "--out", str(tmp_path / "demo.mp4"), timeout=300)
    assert demo.returncode == 0, demo.stderr
    run = run_cli("run", "--model", str(model), "--source", str(video), "--max-frames", "6", "--json", timeout=300)
    assert run.returncode == 0, run.stderr
    a, b = json.loads(demo.stdout), json.loads(run.stdout)
    assert a["thresholds"] == b["thresholds"] == {"conf": 0.25, "iou": 0.45, "max_det": 300}
    assert a["detections"] == b["detections"] and a["detections_per_class"] == b["detections_per_class"]
    again = run_cli("demo", "--max-frames", "2", "--out", str(tmp_path / "demo.mp4"), timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"edgert: {tmp_path / 'demo.mp4'} exists; the demo replaces it" in again.stderr
    assert "detections" in again.stdout and "at conf 0.25, iou 0.45" in again.stdout


def test_one_image_reports_no_frame_rate(tmp_path: Path) -> None:
    cv2 = pytest.importorskip("cv2")
    from tests.pipeline.media import tiny_detector

    image = tmp_path / "one.jpg"
    cv2.imwrite(str(image), np.full((64, 64, 3), 40, np.uint8))
    r = run_cli("run", "--model", str(tiny_detector(tmp_path / "t.onnx")), "--source", str(image), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    frames = [line for line in r.stdout.splitlines() if line.startswith("frames ")]
    assert frames == ["frames     1 (end of input)"], r.stdout
    assert "edgert: run:" not in r.stderr  # no progress for one image
