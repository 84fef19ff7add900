"""The INT8 share of multiply-accumulates, on tiny models whose answer is known by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.calib.macs import count_macs


def _init(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, np.float32) * 0.1, name)


def _qdq(x: str, out: str, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> None:
    inits += [numpy_helper.from_array(np.array(0.05, np.float32), f"{x}_s"),
              numpy_helper.from_array(np.array(0, np.int8), f"{x}_z")]
    nodes += [helper.make_node("QuantizeLinear", [x, f"{x}_s", f"{x}_z"], [f"{x}_q"], name=f"{x}_Q"),
              helper.make_node("DequantizeLinear", [f"{x}_q", f"{x}_s", f"{x}_z"], [out], name=f"{x}_DQ")]


def _model(runtime_pad: bool = False) -> onnx.ModelProto:
    """x [1,3,8,8] -> conv_a (3->4, 3x3, pad 1; INT8: data and weight through Q/DQ)
    -> conv_dw (4->4, group 4, 3x3, pad 1; only its data through Q/DQ: float)
    -> conv_s2 (4->6, 1x1, stride 2) -> Flatten [1, 96] -> gemm (96 -> 10; INT8) -> matmul (10 -> 2; float)."""
    nodes: list[onnx.NodeProto] = []
    inits = [_init("wa", 4, 3, 3, 3), _init("wdw", 4, 1, 3, 3), _init("ws2", 6, 4, 1, 1), _init("wg", 10, 96),
             _init("wm", 10, 2)]
    _qdq("x", "x_dq", nodes, inits)
    _qdq("wa", "wa_dq", nodes, inits)
    nodes.append(helper.make_node("Conv", ["x_dq", "wa_dq"], ["a"], name="conv_a", pads=[1, 1, 1, 1]))
    _qdq("a", "a_dq", nodes, inits)
    src = "a_dq"
    if runtime_pad:  # pad amounts computed at run time: shape inference cannot tell what follows
        inits.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.float32), "pads_f"))
        nodes += [helper.make_node("Cast", ["pads_f"], ["pads"], name="cast_pads", to=TensorProto.INT64),
                  helper.make_node("Pad", ["a_dq", "pads"], ["a_pad"], name="pad"),
                  helper.make_node("Slice", ["a_pad", "st", "en"], ["a_cut"], name="cut")]
        inits += [numpy_helper.from_array(np.array([1, 1], np.int64), "st"),
                  numpy_helper.from_array(np.array([9, 9], np.int64), "en")]
        # Slice axes default to the first two: make them the spatial ones
        nodes[-1].input.append("axes")
        inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
        src = "a_cut"
    nodes.append(helper.make_node("Conv", [src, "wdw"], ["dw"], name="conv_dw", pads=[1, 1, 1, 1], group=4))
    nodes.append(helper.make_node("Conv", ["dw", "ws2"], ["s2"], name="conv_s2", strides=[2, 2]))
    nodes.append(helper.make_node("Flatten", ["s2"], ["flat"], name="flatten"))
    _qdq("flat", "flat_dq", nodes, inits)
    _qdq("wg", "wg_dq", nodes, inits)
    nodes.append(helper.make_node("Gemm", ["flat_dq", "wg_dq"], ["g"], name="gemm", transB=1))
    nodes.append(helper.make_node("MatMul", ["g", "wm"], ["y"], name="matmul"))
    graph = helper.make_graph(nodes, "macs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


#: By hand: output elements x products summed per element.
KNOWN = {
    "conv_a": 4 * 8 * 8 * (3 * 3 * 3),  # 6912
    "conv_dw": 4 * 8 * 8 * (1 * 3 * 3),  # depthwise: one input channel per output, 2304
    "conv_s2": 6 * 4 * 4 * 4,  # 1x1, stride 2: 384
    "gemm": 10 * 96,  # 960
    "matmul": 2 * 10,  # 20
}


@pytest.mark.parametrize("runtime_pad", [False, True])
def test_macs_and_int8_share_known_answer(runtime_pad: bool) -> None:
    if runtime_pad:
        pytest.importorskip("onnxruntime")
    count = count_macs(_model(runtime_pad))
    assert count.layers == KNOWN and count.unknown == []
    assert count.int8 == {"conv_a", "gemm"}  # conv_dw's weight and matmul's inputs are float
    assert count.total == 10580 and count.int8_macs == 6912 + 960
    assert count.share == pytest.approx(7872 / 10580)
    d = count.to_dict()
    assert d["int8_layers"] == 2 and d["layers"] == 5 and d["int8_share"] == round(7872 / 10580, 4)


def test_a_model_without_weighted_layers_has_nothing_in_float() -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    count = count_macs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert count.total == 0 and count.share == 1.0


@pytest.mark.assets
@pytest.mark.parametrize(("name", "total", "layers"), [
    ("nanodet-m-416-coco-v8layout.onnx", 2_090_239_996, 35),
    ("yolov8s-fall-640.onnx", 14_217_446_400, 64),
    ("yolov3-tiny-coco-416.onnx", 2_782_480_896, 13),  # its ZeroPad2d pads at run time: ONNX Runtime tells
])
def test_asset_detectors_macs(assets: Path, name: str, total: int, layers: int) -> None:
    pytest.importorskip("onnxruntime")
    count = count_macs(onnx.load(str(assets / "models/detection" / name)))
    assert count.total == total and len(count.layers) == layers and count.unknown == []
    assert count.share == 0.0  # FP32: nothing in INT8
