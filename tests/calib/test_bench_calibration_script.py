"""scripts/bench_calibration.py's side-by-side helpers on a tiny detector: every tool gets edgert's own draw
and preprocessing, and is evaluated on the images that draw left out."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest

from tests.helpers import ROOT, run_cli

from .models import tiny_detector, write_images

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the script imports its sibling _bench
    return importlib.import_module("bench_calibration")


def test_data_is_edgerts_draw_through_its_preprocessor(bench: ModuleType, tmp_path: Path) -> None:
    import cv2

    from edgert.builder.onnx_info import inspect_onnx
    from edgert.config import PipelineConfig
    from edgert.types import TensorSpec
    from edgert.vision.preprocess import Preprocessor

    folder = tmp_path / "imgs"
    write_images(folder, 7)
    model = tiny_detector(tmp_path / "det.onnx")
    info = bench.calibration_data(model, folder, 4, tmp_path / "det.npz")
    r = run_cli("calibrate", str(model), "--images", str(folder), "--num", "4", "--no-check", "--json",
                "-o", str(tmp_path / "det.int8.onnx"))
    assert r.returncode == 0, r.stderr
    assert info["used_files"] == json.loads(r.stdout)["images"]["used_files"]
    with np.load(tmp_path / "det.npz") as f:
        assert list(f.files) == [info["input"]]
        data = f[info["input"]]
    assert data.shape == (4, 3, 32, 32) and data.dtype == np.float32
    first = inspect_onnx(model).inputs[0]
    pre = Preprocessor(PipelineConfig().preprocess, TensorSpec(first.name, first.shape, np.dtype(np.float32)), {})
    for i, path in enumerate(info["used_files"]):
        buf = pre.allocate()
        pre(cv2.imread(path), buf)
        np.testing.assert_array_equal(data[i:i + 1], buf)


def test_ort_row_quantizes_the_npz_and_is_evaluated_on_the_other_images(bench: ModuleType, tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 6)
    model = tiny_detector(tmp_path / "det.onnx")
    info = bench.calibration_data(model, folder, 4, tmp_path / "det.npz")
    used = tmp_path / "used.json"
    used.write_text(json.dumps(info["used_files"]))
    out = tmp_path / "det.ort.onnx"
    q = bench.ort_quantize(model, tmp_path / "det.npz", "minmax", out)
    assert q["rc"] == 0, q.get("stderr")
    assert q["peak_rss_mb"] > 0 and q["excluded_nodes"] > 0  # the decoding tail stays float
    summary = bench.qdq_summary(out)
    assert summary["quantize_linear"] > 0 and "Conv" in summary["ops_on_dq"]
    ev = bench.evaluate(model, out, folder, None, 0, used)
    assert ev["rc"] == 0, ev.get("error")
    assert ev["frames"] == 2  # the 6 images less the 4 of the draw
    assert 0.0 <= ev["map50_95"] <= 1.0


def test_carry_metadata_adds_only_what_the_output_lacks(bench: ModuleType, tmp_path: Path) -> None:
    src = tiny_detector(tmp_path / "src.onnx")
    m = onnx.load(str(src))
    onnx.helper.set_model_props(m, {"names": "{0: 'a', 1: 'b', 2: 'c'}", "stride": "4"})
    onnx.save(m, str(src))
    out = tiny_detector(tmp_path / "out.onnx")
    m = onnx.load(str(out))
    onnx.helper.set_model_props(m, {"stride": "8"})
    onnx.save(m, str(out))
    assert bench.carry_metadata(src, out) == ["names"]
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert props == {"names": "{0: 'a', 1: 'b', 2: 'c'}", "stride": "8"}  # its own value kept
    assert bench.carry_metadata(src, out) == []


def test_tools_table_has_a_row_per_tool_and_a_column_per_model(bench: ModuleType) -> None:
    rows = {
        "a/modelopt": {"wall_s": 12.5, "peak_rss_mb": 700.4, "eval": {"map50_95": 0.8612, "strict_map50_95": 0.7},
                       "tensorrt_rtx": {"built": True}},
        "b/modelopt": {"error": "Traceback\nValueError: no calibration data"},
        "b/edgert": {"wall_s": 20.0, "peak_rss_mb": 500.0, "eval": {"map50_95": 0.9, "strict_map50_95": 0.8},
                     "tensorrt_rtx": {"built": True, "engine_mb": 9.5}, "qdq": {"int8_mac_share": 0.9123}},
        "b/ort-entropy": {"skipped": "memory"},
    }
    table = bench.tools_table(rows, ["a", "b"], ["modelopt", "ort-entropy"]).splitlines()
    assert table[0] == "| tool | a | b |"
    assert table[2] == (f"| {bench.TOOLS['modelopt']} | 0.861 (0.700), 12.5 s, 700 MiB, RTX built | "
                        "failed: ValueError: no calibration data |")
    assert table[3] == f"| {bench.TOOLS['ort-entropy']} | not run | not run (memory) |"
    edgert = bench.tools_table(rows, ["b"], ["edgert"]).splitlines()[2]
    assert edgert == f"| {bench.TOOLS['edgert']} | 0.900 (0.800), 20.0 s, 500 MiB, INT8 MACs 91 %, RTX built 9.5 MB |"
    rows["b/modelopt"] = {"wall_s": 10.0, "tensorrt_rtx": {"engine_mb": 10.0}}
    assert bench.ratios(rows, ["b"]) == {"b": {"wall": 2.0, "engine": 0.95}}
