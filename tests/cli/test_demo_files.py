"""``edgert demo --files``: an FP32 model, photos and a labelled val set made from the packaged data alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgert.demo_files import demo_files, packaged_data
from tests.helpers import run_cli

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("cv2")


def test_the_fp32_model_computes_what_the_packaged_one_does(tmp_path: Path) -> None:
    files = demo_files(tmp_path / "demo")
    model = onnx.load(str(files.model))
    assert not [n for n in model.graph.node if n.op_type in ("DequantizeLinear", "QuantizeLinear")]
    assert all(t.data_type == onnx.TensorProto.FLOAT for t in model.graph.initializer if len(t.dims) == 4)
    x = np.random.default_rng(0).random((1, 3, 416, 416), np.float32)
    ours = ort.InferenceSession(str(files.model), providers=["CPUExecutionProvider"])
    packaged = ort.InferenceSession(str(packaged_data() / "nanodet-m-416-int8w.onnx"),
                                    providers=["CPUExecutionProvider"])
    a, b = ours.run(None, {"images": x})[0], packaged.run(None, {"images": x})[0]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)
    labels = json.loads(files.val_labels.read_text())
    assert len(files.photo_paths()) == len(labels["images"]) == 8
    assert sorted(p.name for p in files.val_images.glob("*.jpg")) == [im["file_name"] for im in labels["images"]]
    again = demo_files(tmp_path / "demo")  # made once: a second call reuses the files
    assert again.model.stat().st_mtime_ns == files.model.stat().st_mtime_ns


def test_demo_files_lists_them_and_val_runs_on_them(tmp_path: Path) -> None:
    r = run_cli("demo", "--files", "demo", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert listed["model"] == "demo/nanodet-m-416.onnx" and (tmp_path / listed["val_labels"]).is_file()
    r = run_cli("val", listed["model"], "--images", listed["val_images"], "--labels", listed["val_labels"], "--json",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["images"] == 8 and result["instances"] == 51 and result["map50"] > 0.9
