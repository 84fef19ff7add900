"""Messages that are true (issue #23): each misleading message a stranger met, now one line that says what is so.

Through the CLI in a subprocess, on real files: the packaged demo model and clip, and small made ones.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from edgert.config import ModelConfig, PipelineConfig, SourceConfig
from edgert.io.sinks import FrameResult, Sink, StreamInfo
from edgert.pipeline import Pipeline
from tests.helpers import ROOT, assert_one_line_error, run_cli
from tests.pipeline.media import make_video, tiny_detector

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

DATA = ROOT / "edgert" / "demo_data"
MODEL = DATA / "nanodet-m-416-int8w.onnx"
CLIP = DATA / "vtest-384x288.mp4"


def test_a_config_runs_from_another_working_directory(tmp_path: Path) -> None:
    """model, source and sinks in the YAML follow the file (they followed the working directory)."""
    folder = tmp_path / "project"
    (folder / "models").mkdir(parents=True)
    shutil.copy2(MODEL, folder / "models" / "m.onnx")
    shutil.copy2(CLIP, folder / "clip.mp4")
    (folder / "p.yaml").write_text("model: models/m.onnx\nsource: clip.mp4\nsinks: ['jsonl://out/e.jsonl']\n"
                                   "runtime: {max_frames: 3}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run_cli("run", "--config", str(folder / "p.yaml"), "--json", cwd=elsewhere, timeout=180)
    assert r.returncode == 0, r.stderr
    assert len((folder / "out" / "e.jsonl").read_text().splitlines()) == 3
    assert not (elsewhere / "out").exists()


@pytest.mark.parametrize(("uri", "needle"), [
    ("webrtc://@:8554/x", "webrtc://@:8554/x: webrtc:// sources are not supported"),
    ("rtp://@:1234", "rtp://@:1234: rtp:// sources are not supported. Note: receive it with gst://udpsrc"),
    ("foo://camera/1", "foo://camera/1: foo:// sources are not supported. Note: sources are csi://N"),
])
def test_unknown_source_schemes_are_named(uri: str, needle: str) -> None:
    r = run_cli("run", "--model", str(MODEL), "--source", uri, timeout=120)
    assert_one_line_error(r, needle)
    assert "video file not found" not in r.stderr


def test_an_engine_on_a_backend_without_tensorrt_says_tensorrt_is_needed(tmp_path: Path) -> None:
    engine = tmp_path / "nanodet.engine"
    engine.write_bytes(b"ftrt" + bytes(64))  # what a serialized engine starts like; not ONNX
    for backend in ("auto", "onnxruntime"):
        r = run_cli("run", "--model", str(engine), "--backend", backend, "--source", str(CLIP), timeout=120)
        if backend == "auto" and r.returncode == 0:
            pytest.skip("TensorRT is here: auto chose it")
        assert_one_line_error(r, f"{engine}: a TensorRT engine; backend onnxruntime runs ONNX models",
                              "running an engine needs TensorRT")
        assert "INVALID_PROTOBUF" not in r.stderr


def test_a_run_without_sinks_says_nothing_was_saved(tmp_path: Path) -> None:
    r = run_cli("run", "--model", str(MODEL), "--source", str(CLIP), "--max-frames", "2", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no sink given, so nothing was saved. Note: add --sink out.mp4" in r.stderr
    assert list(tmp_path.iterdir()) == []  # and indeed nothing was written
    r = run_cli("run", "--model", str(MODEL), "--source", str(CLIP), "--max-frames", "2", "--sink",
                f"jsonl://{tmp_path}/e.jsonl", timeout=120)
    assert r.returncode == 0 and "nothing was saved" not in r.stderr


def test_the_text_summary_prints_line_and_zone_counts(tmp_path: Path) -> None:  # ByteTrack: edgert's own
    config = tmp_path / "count.yaml"
    config.write_text(
        f"model: {MODEL}\nsource: {CLIP}\ndecode: {{conf: 0.35}}\n"
        "track: {tracker: bytetrack, frame_rate: 10}\n"
        "analytics:\n  lines: [{name: middle, points: [[0, 144], [384, 144]], classes: [person]}]\n"
        "  zones: [{name: lower, polygon: [[0, 144], [384, 144], [384, 288], [0, 288]]}]\n"
        "runtime: {max_frames: 60}\n")
    r = run_cli("run", "--config", str(config), timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    line = next(x for x in lines if x.startswith("line       middle: "))
    zone = next(x for x in lines if x.startswith("zone       lower: "))
    assert " in, " in line and " out" in line and "person" in line
    assert "entered" in zone and "exited" in zone
    assert any(x.startswith("tracks     ") for x in lines)
    summary = json.loads(run_cli("run", "--config", str(config), "--json", timeout=300).stdout)
    ins = summary["counts"]["middle"]["person"]["in"]
    assert f"person {ins} in," in line


class _SlowViewer(Sink):
    """A preview-like sink (skips frames by design) that is slower than the pipeline."""

    needs_image = True
    skips_frames = True

    def __init__(self) -> None:
        super().__init__("viewer://slow")
        self.frames = 0

    def open(self, info: StreamInfo) -> None:
        pass

    def write(self, result: FrameResult) -> None:
        time.sleep(0.05)
        self.frames += 1


def test_frames_a_slow_viewer_skips_are_skipped_not_dropped(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=40)
    config = PipelineConfig(model=ModelConfig(path=str(tiny_detector(tmp_path / "tiny.onnx"))),
                            source=SourceConfig(uri=str(video)))
    viewer = _SlowViewer()
    pipeline = Pipeline(config, sinks=[viewer, "http://127.0.0.1:0"], handle_signals=False)
    summary = pipeline.run()
    assert summary["frames"] == 40
    assert summary["dropped"] == 0 and summary["drops"] == {}  # the source lost nothing
    assert summary["skipped"]["sink:viewer://slow"] == 40 - viewer.frames > 0
    assert pipeline.stats.dropped == 0  # what the metrics and the report read
    assert all(not k.startswith("sink:") for s in summary["sources"] for k in s["drops"])
