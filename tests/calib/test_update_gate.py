"""The build and gate process of a model update, run as the pipeline runs it (``python -m
edgert.calib.update_gate JOB.json``): INT8 calibrated on the held frames and checked against its FP32 self; the
class-count check's bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.calib.update_gate import check_counts
from tests.helpers import ROOT

pytest.importorskip("onnxruntime")


def test_count_check_bounds() -> None:
    assert check_counts(100, 100, 16, 4.0) is None
    assert check_counts(100, 30, 16, 4.0) is None
    assert "0 detections on 16 held frames where the current model found 100" in str(check_counts(100, 0, 16, 4.0))
    assert check_counts(100, 500, 16, 4.0) is not None  # boxes everywhere
    assert check_counts(0, 10, 16, 4.0) is None  # an empty scene: a few boxes are no flood
    assert check_counts(0, 300, 16, 4.0) is not None


@pytest.mark.slow
def test_int8_from_the_held_frames(assets: Path, tmp_path: Path) -> None:
    cv2 = pytest.importorskip("cv2")
    model = tmp_path / "cam.onnx"
    model.symlink_to(assets / "models/detection/nanodet-m-416-coco-v8layout.onnx")
    cap = cv2.VideoCapture(str(assets / "video/vtest.avi"))
    frames = []
    for i in range(40):
        ok, frame = cap.read()
        if ok and i % 8 == 0:
            frames.append(frame)
    np.savez(tmp_path / "frames.npz", **{f"f_{i}": f for i, f in enumerate(frames)})
    job = {"candidate": str(model), "out": str(tmp_path), "precision": "int8", "frames": str(tmp_path / "frames.npz"),
           "counts": [{"person": 3}] * len(frames), "min_map": 0.5, "max_count_ratio": 4.0, "config": {}}
    (tmp_path / "job.json").write_text(json.dumps(job))
    r = subprocess.run([sys.executable, "-m", "edgert.calib.update_gate", str(tmp_path / "job.json")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x.get("step") for x in lines[:-1]] == ["calibrating", "opening", "checking"]
    result = lines[-1]["result"]
    assert result["ok"], result
    assert result["built"] == str(tmp_path / "cam.int8.onnx") and Path(result["built"]).exists()
    assert result["reference"] == str(model) and result["map50_95"] >= 0.5
    assert not list(tmp_path.glob("frames-*"))  # the held frames written for calibration are gone


@pytest.mark.slow
def _engine_gate(assets: Path, tmp_path: Path, **job: object) -> list[dict[str, object]]:
    """The child's lines for NanoDet as the candidate of a TensorRT-RTX run (it builds on a machine without a
    GPU), with ``job``'s settings added; edgert's cache in ``tmp_path/cache``."""
    model = tmp_path / "cam.onnx"
    model.symlink_to(assets / "models/detection/nanodet-m-416-coco-v8layout.onnx")
    np.savez(tmp_path / "frames.npz", f_0=np.full((288, 384, 3), 114, np.uint8))
    job = {"candidate": str(model), "out": str(tmp_path), "frames": str(tmp_path / "frames.npz"), "counts": [{}],
           "min_map": 0.5, "max_count_ratio": 4.0, "config": {}, "builds_engines": True, "backend": "tensorrt-rtx",
           "engine_precision": "fp16", **job}
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "EDGERT_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "edgert.calib.update_gate", str(tmp_path / "job.json")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    return [json.loads(x) for x in r.stdout.splitlines()]


def test_an_engine_is_built_in_the_child_beside_the_candidate(assets: Path, tmp_path: Path) -> None:
    """A TensorRT run never builds while serving: the child builds ``MODEL.engine`` (here with TensorRT-RTX, which
    builds on a machine without a GPU), and checks the engine, not the ONNX, against the FP32 model; with no GPU
    the check itself cannot run, and the candidate is refused saying so."""
    pytest.importorskip("tensorrt_rtx")
    from edgert.platform import gpu_present

    lines = _engine_gate(assets, tmp_path)
    assert lines[0] == {"progress": 20, "step": "building engine"}
    # the build's own progress lines move the job on from 20 towards 40 % while it builds
    building = [line["progress"] for line in lines if line.get("step") == "building engine"]
    assert len(building) > 2 and building == sorted(building) and 20 < building[-1] <= 40, building
    assert (tmp_path / "cam.engine").exists() and (tmp_path / "cam.engine.json").exists()
    if not gpu_present()[0]:
        result: Any = lines[-1]["result"]
        assert not result["ok"] and "no GPU" in result["why"]


def test_a_run_of_several_sources_gets_the_batch_engine_it_opens(assets: Path, tmp_path: Path) -> None:
    """A run of 4 frames a call opens the engine beside the candidate's dynamic-batch copy, built for 1..4 frames
    with a profile per GPU slot (``edgert build --batch 4``): the child builds that one, not a batch-1 engine."""
    pytest.importorskip("tensorrt_rtx")
    lines = _engine_gate(assets, tmp_path, batch=4)
    assert {"progress": 40, "step": "opening"} in lines  # built
    (engine,) = (tmp_path / "cache" / "batch").glob("*.batch.engine")
    assert not (tmp_path / "cam.engine").exists()
    side = json.loads(engine.with_name(engine.name + ".json").read_text())
    assert side["profiles"][0]["max"][0] == 4 and side["builder_flags"]["contexts"] == 4


def test_a_candidate_the_builder_refuses_is_rejected_with_the_builders_reason(tmp_path: Path) -> None:
    """The build's progress lines are read apart from its other stderr lines: a failed build's own last line is
    the reason the candidate is rejected (here TensorRT-RTX's parser meeting an operator it has no plugin for)."""
    pytest.importorskip("tensorrt_rtx")
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    graph = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    save(model, str(tmp_path / "cam.onnx"))
    np.savez(tmp_path / "frames.npz", f_0=np.full((288, 384, 3), 114, np.uint8))
    job = {"candidate": str(tmp_path / "cam.onnx"), "out": str(tmp_path), "frames": str(tmp_path / "frames.npz"),
           "counts": [{}], "min_map": 0.5, "max_count_ratio": 4.0, "config": {}, "builds_engines": True,
           "backend": "tensorrt-rtx", "engine_precision": "fp16"}
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "EDGERT_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "edgert.calib.update_gate", str(tmp_path / "job.json")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    result = json.loads(r.stdout.splitlines()[-1])["result"]
    assert not result["ok"]
    assert result["why"].startswith("the engine build failed: edgert: error: ")
    assert "Frobnicate" in result["why"] and "\n" not in result["why"]
