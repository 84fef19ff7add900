"""FP16 conversion on real (tiny) ONNX models run in ONNX Runtime, and on the shared detectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert._lazy import is_importable
from edgert.errors import ModelError
from tests.builder.test_onnx_info import qdq_model
from tests.helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.skipif(not is_importable("onnxconverter_common"),
                                reason="onnxconverter-common not installed: pip install 'edgert[fp16]'")

ort = pytest.importorskip("onnxruntime")


def conv_head(path: Path, resize: bool = False) -> Path:
    """conv -> relu -> [resize x2] -> conv -> (softmax over channels, + a shared offset, x 300) -> output.

    The offset initializer is read by the body (an Add after the first conv) and by the tail, so the
    tail's float32 copy must not be the converted one.
    """
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    side = 16 if resize else 8
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, side, side])
    inits = [numpy_helper.from_array(0.3 * rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(0.3 * rng.normal(size=(4, 4, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(0.3, np.float32), "offset"),
             numpy_helper.from_array(np.array(300.0, np.float32), "pixels")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Add", ["c1", "offset"], ["a1"], name="add1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu1")]
    last = "r1"
    if resize:
        inits += [numpy_helper.from_array(np.array([], np.float32), "roi"),
                  numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
        nodes.append(helper.make_node("Resize", ["r1", "roi", "scales"], ["up"], mode="nearest", name="resize"))
        last = "up"
    nodes += [helper.make_node("Conv", [last, "w2"], ["c2"], name="conv2"),
              helper.make_node("Softmax", ["c2"], ["s"], axis=1, name="softmax"),
              helper.make_node("Add", ["s", "offset"], ["so"], name="decode"),
              helper.make_node("Mul", ["so", "pixels"], ["y"], name="scale")]
    model = helper.make_model(helper.make_graph(nodes, "head", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def run(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {"x": x})[0]
    return out


@pytest.mark.parametrize("resize", [False, True])
def test_body_in_fp16_tail_and_io_in_float32(tmp_path: Path, resize: bool) -> None:
    from edgert.rewrite.fp16 import convert_file

    src = conv_head(tmp_path / "m.onnx", resize)
    dst = tmp_path / "m.fp16.onnx"
    summary = convert_file(src, dst)
    model = onnx.load(str(dst))
    g = model.graph
    assert g.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert g.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    inits = {i.name: i for i in g.initializer}
    convs = {n.name: n for n in g.node if n.op_type == "Conv"}
    assert inits[convs["conv1"].input[1]].data_type == TensorProto.FLOAT16
    assert inits[convs["conv2"].input[1]].data_type == TensorProto.FLOAT16
    # the tail (softmax, decode) reads float32 and its offset is a float32 copy
    decode = next(n for n in g.node if n.name == "decode")
    assert inits[decode.input[1]].data_type == TensorProto.FLOAT
    assert summary["float32_why"] == {"decoding tail": 3}
    x = np.random.default_rng(1).random((1, 3, 8, 8), dtype=np.float32)
    a, b = run(src, x), run(dst, x)
    assert a.shape == b.shape and b.dtype == np.float32
    np.testing.assert_allclose(b, a, rtol=2e-3)
    assert not np.array_equal(a, b)  # the body really ran in FP16


def test_already_fp16_and_qdq_models_are_one_line_errors(tmp_path: Path) -> None:
    src = conv_head(tmp_path / "m.onnx")
    fp16 = tmp_path / "m.fp16.onnx"
    assert run_cli("convert", str(src), "-o", str(fp16)).returncode == 0
    assert_one_line_error(run_cli("convert", str(fp16), "-o", str(tmp_path / "again.onnx")), "already FP16")
    assert not (tmp_path / "again.onnx").exists()
    assert_one_line_error(run_cli("convert", str(qdq_model(tmp_path / "q.onnx")), "-o", str(tmp_path / "q16.onnx")),
                          "Q/DQ")
    assert_one_line_error(run_cli("convert", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "x.onnx")),
                          "not found")


def test_weights_stored_fp16_but_computing_in_float32_convert(tmp_path: Path) -> None:
    """The Whisper assets store weights as float16 and Cast them to float32: that is an FP32 model."""
    from edgert.rewrite.fp16 import fp16_state, to_fp16

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    w = numpy_helper.from_array(np.eye(4, dtype=np.float16), "w16")
    nodes = [helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 13)])
    assert fp16_state(model) == "float32"
    converted = to_fp16(model).model
    assert fp16_state(converted) == "float16"
    with pytest.raises(ModelError, match="already FP16"):
        to_fp16(converted)


@pytest.mark.assets
@pytest.mark.parametrize("name", ["nanodet-m-416-coco-v8layout.onnx", "yolov8s-fall-640.onnx"])
def test_shared_detectors_agree_with_fp32(assets: Path, tmp_path: Path, name: str) -> None:
    from edgert.calib.comparison import compare_detectors, evaluation_frames
    from edgert.rewrite.fp16 import convert_file

    src = assets / "models" / "detection" / name
    dst = tmp_path / "fp16.onnx"
    summary = convert_file(src, dst)
    assert summary["float32_nodes"] > 0 and summary["fp16_nodes"] > 100
    assert summary["bytes"][1] < 0.6 * summary["bytes"][0]  # weights in half the bytes
    frames = [f for i, f in zip(range(6), evaluation_frames(assets / "images"))]
    report = compare_detectors(src, dst, frames)
    assert report["map"]["ground_truth"] > 5
    assert report["map"]["map50_95"] >= 0.98, report["map"]
