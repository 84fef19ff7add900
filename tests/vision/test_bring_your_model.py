"""Models people export themselves: the NMS-free end-to-end layout of Ultralytics YOLO26 / YOLOv10 (output
[1,300,6]: x1,y1,x2,y2,score,class) and the YOLOv8/11 layout ([1,4+C,N]) decode to the same boxes through
``edgert run``; another framework's file gets one line naming the export step.

Both models are built here with ``onnx.helper``: their output is a constant (plus 0 x the input, so the
input is used) that encodes the same three boxes, as each exporter lays them out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import assert_one_line_error, run_cli

pytest.importorskip("onnxruntime")
cv2 = pytest.importorskip("cv2")

SIZE = 64  # the model's input, square
NAMES = "{0: 'person', 1: 'bicycle', 2: 'car'}"
#: x1, y1, x2, y2, score, class in the model's input pixels; far apart, so NMS keeps all three.
BOXES = np.array([[4, 8, 20, 40, 0.9, 0], [30, 10, 60, 30, 0.8, 2], [10, 44, 26, 60, 0.6, 1]], np.float32)


def _constant_model(path: Path, value: np.ndarray, end2end: bool) -> Path:
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, SIZE, SIZE])
    y = helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(value.shape))
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["m"], axes=[1, 2, 3], keepdims=0),
        helper.make_node("Mul", ["m", "zero"], ["z"]),
        helper.make_node("Add", ["k", "z"], ["output0"]),
    ]
    inits = [numpy_helper.from_array(value, "k"), numpy_helper.from_array(np.zeros(1, np.float32), "zero")]
    graph = helper.make_graph(nodes, "exported", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    meta = {"task": "detect", "stride": "32", "imgsz": f"[{SIZE}, {SIZE}]", "names": NAMES}
    if end2end:
        meta["end2end"] = "True"
    for key, val in meta.items():
        model.metadata_props.add(key=key, value=val)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def yolo26_model(path: Path) -> Path:
    """[1,300,6]: the boxes first, then zero rows (what an NMS-free export pads with)."""
    out = np.zeros((1, 300, 6), np.float32)
    out[0, : len(BOXES)] = BOXES
    return _constant_model(path, out, end2end=True)


def yolov8_model(path: Path, anchors: int = 84) -> Path:
    """[1,4+C,N]: cx,cy,w,h then one score per class for each anchor; each box is found by 3 anchors
    (slightly shifted, lower scores) as a real head does, so NMS has work to do."""
    out = np.zeros((1, 4 + 3, anchors), np.float32)
    col = 0
    for x1, y1, x2, y2, score, cls in BOXES:
        for shift, factor in ((0.0, 1.0), (0.5, 0.9), (-0.5, 0.8)):
            out[0, :4, col] = [(x1 + x2) / 2 + shift, (y1 + y2) / 2, x2 - x1, y2 - y1]
            out[0, 4 + int(cls), col] = score * factor
            col += 1
    return _constant_model(path, out, end2end=False)


def _run(model: Path, image: Path, tmp_path: Path) -> list[dict]:
    out = tmp_path / f"{model.stem}.jsonl"
    r = run_cli("run", "--model", str(model), "--source", str(image), "--sink", f"jsonl://{out}",
                "--backend", "onnxruntime", "--conf", "0.5")
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    frames = [rec for rec in records if "detections" in rec]
    assert len(frames) == 1, records
    return sorted(frames[0]["detections"], key=lambda d: d["box"])


def test_yolo26_end2end_and_yolov8_decode_to_the_same_boxes(tmp_path: Path) -> None:
    image = tmp_path / "frame.jpg"  # twice the model's size: the boxes come back scaled by 2
    cv2.imwrite(str(image), np.full((2 * SIZE, 2 * SIZE, 3), 90, np.uint8))
    e2e = _run(yolo26_model(tmp_path / "yolo26n.onnx"), image, tmp_path)
    v8 = _run(yolov8_model(tmp_path / "yolov8n.onnx"), image, tmp_path)
    want = sorted(([float(v) * 2 for v in b[:4]], str(name)) for b, name in zip(
        BOXES, ["person", "car", "bicycle"]))
    for found in (e2e, v8):
        got = [(d["box"], d["class_name"]) for d in found]
        assert [g[1] for g in got] == [w[1] for w in want]
        np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=0.01)
    np.testing.assert_allclose([d["confidence"] for d in e2e], [d["confidence"] for d in v8], atol=1e-6)


@pytest.mark.parametrize("suffix,needle", [
    (".pt", "yolo export model=yolov8n.pt format=onnx"),
    (".pth", "yolo export model=yolov8n.pth format=onnx"),
    (".tflite", "export it to ONNX first"),
    (".engine", "yolo export model=X.pt format=onnx"),
])
def test_a_non_onnx_model_names_the_export_step(tmp_path: Path, suffix: str, needle: str) -> None:
    model = tmp_path / f"yolov8n{suffix}"
    model.write_bytes(b"PK\x03\x04 not an onnx file")
    image = tmp_path / "frame.jpg"
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    r = run_cli("run", "--model", str(model), "--source", str(image), "--backend", "onnxruntime")
    assert_one_line_error(r, needle)
    r = run_cli("inspect", str(model), "--backend", "onnxruntime")
    assert_one_line_error(r, needle)


def test_inspect_names_the_decoder_or_why_none_fits(tmp_path: Path) -> None:
    from tests.helpers import tiny_model

    r = run_cli("inspect", str(yolo26_model(tmp_path / "yolo26n.onnx")), "--backend", "onnxruntime")
    assert r.returncode == 0, r.stderr
    assert "decoder   end2end (3 classes)" in r.stdout
    r = run_cli("inspect", str(tiny_model(tmp_path / "seg.onnx", (1, 3, 32, 32))), "--backend", "onnxruntime")
    assert r.returncode == 0, r.stderr
    assert "decoder   none: model outputs y float32[1,3,32,32] match no detection decoder" in r.stdout
