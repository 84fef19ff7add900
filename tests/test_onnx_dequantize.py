"""A Q/DQ model's float twin (edgert.onnx_dequantize) on a model built here and on the packaged detector."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.onnx_dequantize import DequantizeError, dequantized

ort = pytest.importorskip("onnxruntime")


def _conv(weights_dq_axis: int = 0) -> tuple[onnx.ModelProto, np.ndarray]:
    """x -> Q/DQ -> Conv whose INT8 weights are dequantized per output channel -> y; and those float weights."""
    rng = np.random.default_rng(0)
    wq = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    ws = np.array([0.01, 0.02, 0.005, 0.03], np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="Q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="DQ"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=weights_dq_axis, name="DQw"),
             helper.make_node("Conv", ["xd", "w"], ["y"], pads=[1, 1, 1, 1])]
    m = helper.make_model(helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(np.array(0.02, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z"),
         numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(ws, "ws"),
         numpy_helper.from_array(np.zeros(4, np.int8), "wz")]), opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m, wq.astype(np.float32) * ws.reshape(4, 1, 1, 1)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0])


def test_the_twin_is_the_float_model_the_quantization_stands_for() -> None:
    model, weights = _conv()
    twin = dequantized(model)
    onnx.checker.check_model(twin)
    assert [n.op_type for n in twin.graph.node] == ["Conv"] and list(twin.graph.node[0].input) == ["x", "w"]
    got = {t.name: numpy_helper.to_array(t) for t in twin.graph.initializer}
    assert set(got) == {"w"} and np.array_equal(got["w"], weights)
    x = np.random.default_rng(1).random((1, 3, 8, 8), dtype=np.float32)
    float_conv = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [numpy_helper.from_array(weights, "w")]),
        opset_imports=[helper.make_opsetid("", 13)])
    float_conv.ir_version = 8
    assert np.array_equal(_run(twin, x), _run(float_conv, x))
    # weights only: the activations' pair stays, and the model computes what the quantized one does (ONNX
    # Runtime runs that one as an int8 convolution: the same values to float rounding)
    weights_only = dequantized(model, activations=False)
    assert [n.op_type for n in weights_only.graph.node] == ["QuantizeLinear", "DequantizeLinear", "Conv"]
    assert np.allclose(_run(weights_only, x), _run(model, x), rtol=1e-5, atol=1e-5)
    assert not np.allclose(_run(weights_only, x), _run(twin, x), rtol=1e-5, atol=1e-5)  # x is rounded there


def test_a_quantize_read_by_another_operator_has_no_twin() -> None:
    model, _ = _conv()
    model.graph.node.append(helper.make_node("Cast", ["xq"], ["xc"], to=TensorProto.FLOAT))
    with pytest.raises(DequantizeError, match=r"QuantizeLinear 'Q' feeds an operator other than DequantizeLinear"):
        dequantized(model)


def test_the_packaged_detector_twin_has_no_quantization_left() -> None:
    import edgert

    model = onnx.load(Path(edgert.__file__).parent / "demo_data" / "nanodet-m-416-int8w.onnx")
    twin = dequantized(model)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in twin.graph.node)
    onnx.checker.check_model(twin)
