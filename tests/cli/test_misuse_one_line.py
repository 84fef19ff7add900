"""Misuse that used to end in a traceback (or in silently wrong results) is one line now, through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import ROOT, assert_one_line_error, run_cli
from tests.pipeline.media import make_video, tiny_detector

cv2 = pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

TIMEOUT = 90


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("misuse")
    return {"root": root, "video": make_video(root / "v.avi", frames=12, size=(96, 64)),
            "model": tiny_detector(root / "tiny.onnx")}


def _gain_detector(path: Path) -> Path:
    """tiny_detector's output times a second input ``gain`` [1]: fed zeros, it finds nothing."""
    channels = 6
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])
    g = helper.make_tensor_value_info("gain", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, channels, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [channels, 3, 8, 8], np.zeros(channels * 3 * 64, np.float32))
    b = helper.make_tensor("b", TensorProto.FLOAT, [channels], np.array([16, 16, 8, 8, 0.9, 0.1], np.float32))
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], np.array([1, channels, 16], np.int64))
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["c"], kernel_shape=[8, 8], strides=[8, 8]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Mul", ["r", "gain"], ["output0"])]
    graph = helper.make_graph(nodes, "gain", [x, g], [y], [w, b, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_model_with_an_input_the_pipeline_cannot_fill_is_refused(media: dict[str, Path]) -> None:
    model = _gain_detector(media["root"] / "gain.onnx")
    base = ("run", "--model", str(model), "--source", str(media["video"]), "--json")
    assert_one_line_error(run_cli(*base, timeout=TIMEOUT), "input gain float32[1]", "cannot fill it",
                          "model.inputs")
    config = media["root"] / "gain.yaml"
    config.write_text("model:\n  inputs:\n    gain: [1.0]\n")
    r = run_cli(*base, "--config", str(config), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["frames"] == 12 and summary["detections"] == 12  # the value reached the model
    config.write_text("model:\n  inputs:\n    gian: [1.0]\n")
    assert_one_line_error(run_cli(*base, "--config", str(config), timeout=TIMEOUT),
                          "model.inputs.gian", "no such input", "images, gain")
    config.write_text("model:\n  inputs:\n    gain: [1.0, 2.0]\n")
    assert_one_line_error(run_cli(*base, "--config", str(config), timeout=TIMEOUT), "do not fit", "[1]")


def test_compare_on_different_detectors_is_not_a_traceback(media: dict[str, Path]) -> None:
    other_layout = tiny_detector(media["root"] / "bigger.onnx", size=64)  # [1,6,64] against [1,6,16]
    r = run_cli("compare", str(media["model"]), str(other_layout), "--video", str(media["video"]), "--frames", "4",
                "--json", timeout=TIMEOUT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    report = json.loads(r.stdout)
    assert report["outputs_not_compared"] == ["output0"] and report["frames"] == 4
    assert "compared on detections only" in r.stderr
    other_classes = tiny_detector(media["root"] / "three.onnx", scores=(0.9, 0.1, 0.2))
    r = run_cli("compare", str(media["model"]), str(other_classes), "--video", str(media["video"]), "--frames", "4",
                timeout=TIMEOUT)
    assert_one_line_error(r, "three.onnx", "other classes", "3 vs 2")


def _piped(command: str) -> subprocess.CompletedProcess[str]:
    """``edgert ... | READER`` in bash; edgert's own exit status is printed last on stderr."""
    edgert = f"{sys.executable} -m edgert.cli.main"
    script = f'{command.replace("edgert", edgert, 1)}; echo "edgert-rc=${{PIPESTATUS[0]}}" >&2'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)


def test_summary_into_a_closed_pipe_ends_quietly(media: dict[str, Path]) -> None:
    # `true` exits at once: every write edgert makes to stdout meets a closed pipe (EPIPE).
    r = _piped(f"edgert run --model {media['model']} --source {media['video']} --json | true")
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert "edgert: error" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == "edgert-rc=141"


def test_events_into_head_end_the_run_quietly(media: dict[str, Path]) -> None:
    # --loop never ends by itself: only the closed stdout can end it.
    r = _piped(f"edgert run --model {media['model']} --source {media['video']} --loop --sink jsonl://- | head -1")
    assert r.stderr.strip().splitlines()[-1] == "edgert-rc=141", r.stderr
    assert "Traceback" not in r.stderr and "edgert: error" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["frame"] == 0


def test_python_m_edgert_is_the_command(media: dict[str, Path], tmp_path: Path) -> None:
    """``python -m edgert`` where the script is not on PATH: the same parser, the same one-line errors."""
    version = subprocess.run([sys.executable, "-m", "edgert", "--version"], capture_output=True, text=True,
                             timeout=TIMEOUT, cwd=ROOT)
    assert version.returncode == 0 and version.stdout.startswith("edgert "), version
    missing = subprocess.run([sys.executable, "-m", "edgert", "run", "--model", str(tmp_path / "none.onnx"),
                              "--source", str(media["video"])], capture_output=True, text=True, timeout=TIMEOUT,
                             cwd=ROOT)
    assert_one_line_error(missing, "none.onnx")
