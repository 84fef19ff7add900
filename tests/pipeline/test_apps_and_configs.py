"""apps/yolo_camera.py runs as a user would run it; the example configs in configs/ load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgert.config import PipelineConfig, load_config
from tests.helpers import ROOT
from tests.pipeline.media import make_video, tiny_detector


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_load(path: Path) -> None:
    config = load_config(path)
    assert isinstance(config, PipelineConfig) and config.model.path and config.source.uri and config.sinks


def test_yolo_camera_app(tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    video = make_video(tmp_path / "v.avi", frames=20)
    model = tiny_detector(tmp_path / "tiny.onnx")
    events = tmp_path / "events.jsonl"
    r = subprocess.run(
        [sys.executable, str(ROOT / "apps" / "yolo_camera.py"), "--model", str(model), "--source", str(video),
         "--sink", f"jsonl://{events}", "--max-frames", "12"],
        capture_output=True, text=True, timeout=90, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "12 frames at" in r.stdout and "running" in r.stderr
    assert [json.loads(line)["frame"] for line in events.read_text().splitlines()] == list(range(12))

    bad = subprocess.run([sys.executable, str(ROOT / "apps" / "yolo_camera.py"), "--model", str(model),
                          "--source", str(tmp_path / "none.mp4")], capture_output=True, text=True, timeout=90)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and "not found" in bad.stderr
