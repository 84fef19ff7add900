from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.builder.onnx_info import ShapeProfile, check_profiles, inspect_onnx, parse_shapes
from edgert.errors import ConfigError, ModelError
from tests.helpers import tiny_model


def qdq_model(path: Path) -> Path:
    """x -> QuantizeLinear -> DequantizeLinear -> Relu: the explicit-quantization pattern."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    model = helper.make_model(helper.make_graph(nodes, "qdq", [x], [y], [scale, zero]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_parse_shapes_fixed_and_ranges() -> None:
    (p,) = parse_shapes(["images:1x3x640x640"])
    assert p == ShapeProfile("images", (1, 3, 640, 640), (1, 3, 640, 640), (1, 3, 640, 640))
    a, b = parse_shapes(["input:1x576/2x576/4x576,state:2x1x128/2x2x128/2x4x128"])
    assert (a.name, a.min, a.opt, a.max) == ("input", (1, 576), (2, 576), (4, 576))
    assert b.name == "state" and b.max == (2, 4, 128)
    # A TensorFlow-style name with a colon keeps it.
    (c,) = parse_shapes(["input:0:1x3"])
    assert c.name == "input:0"


@pytest.mark.parametrize("spec, needle", [
    ("images", "expected NAME:MIN/OPT/MAX"),
    ("images:1x3xx4", "is not a shape"),
    ("images:1x3/1x3", "one shape or three"),
    ("images:2x3/1x3/4x3", "MIN <= OPT <= MAX"),
    ("images:1x3/1x3x4/1x3", "same rank"),
])
def test_parse_shapes_errors_say_what_to_write(spec: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("+", r"\+")):
        parse_shapes([spec])


def test_inspect_reads_interface_qdq_and_metadata(tmp_path: Path) -> None:
    info = inspect_onnx(tiny_model(tmp_path / "t.onnx", shape=("batch", 3, 8, 8)))
    assert [t.name for t in info.inputs] == ["x"] and info.inputs[0].is_dynamic
    assert info.inputs[0].shape == ("batch", 3, 8, 8) and info.inputs[0].dtype == "float32"
    assert not info.has_qdq and info.opset == 13 and len(info.sha256) == 64
    q = inspect_onnx(qdq_model(tmp_path / "q.onnx"))
    assert q.has_qdq and q.node_label(1) == ("dq", "DequantizeLinear") and q.node_label(99) == ("?", "?")


def test_check_profiles_needs_shapes_for_dynamic_inputs(tmp_path: Path) -> None:
    info = inspect_onnx(tiny_model(tmp_path / "t.onnx", shape=("batch", 3, 8, 8)))
    with pytest.raises(ConfigError, match=r"input x has dynamic shape \[batch, 3, 8, 8\]: give --shapes x:"):
        check_profiles(info, [])
    with pytest.raises(ConfigError, match="axis 1 is fixed at 3"):
        check_profiles(info, parse_shapes(["x:1x4x8x8"]))
    with pytest.raises(ConfigError, match="not an input"):
        check_profiles(info, parse_shapes(["nope:1x3x8x8"]))
    (p,) = check_profiles(info, parse_shapes(["x:1x3x8x8/2x3x8x8/8x3x8x8"]))
    assert p.max == (8, 3, 8, 8)


def test_damaged_files_are_model_errors(tmp_path: Path) -> None:
    good = tiny_model(tmp_path / "t.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07\x12\xff garbage" * 10)
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        inspect_onnx(bad)
    with pytest.raises(ModelError, match="not found"):
        inspect_onnx(tmp_path / "missing.onnx")
    half = tmp_path / "half.onnx"
    half.write_bytes(good.read_bytes()[:20])
    with pytest.raises(ModelError):
        inspect_onnx(half)


def test_fp16_qdq_scales_are_refused_for_tensorrt_8_in_one_line(tmp_path: Path) -> None:
    """ModelOpt's default INT8 ONNX has FP16 scales; TensorRT 8.5's parser refused all three detectors with
    "Scale coefficients must all be positive" on the device machine. edgert names the cause and the fix."""
    from edgert.builder.engine_builder import qdq_scale_refusal

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4])
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "qdq16", [x], [y], [numpy_helper.from_array(np.array(0.1, np.float16), "s"),
                                   numpy_helper.from_array(np.array(0, np.int8), "z")]),
        opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "m16.onnx"))
    info = inspect_onnx(tmp_path / "m16.onnx")
    assert info.qdq_scale_types == ("float16",)
    line = qdq_scale_refusal(info, "tensorrt", "8.5.3.1")
    assert line is not None and "\n" not in line
    assert line.startswith("m16.onnx: its Q/DQ scales are FP16, which TensorRT 8.5.3.1's ONNX parser cannot read")
    assert "--high_precision_dtype fp32" in line
    assert qdq_scale_refusal(info, "tensorrt", "10.13.0.35") is None
    assert qdq_scale_refusal(info, "tensorrt-rtx", "1.7.1.116") is None
    fp32 = inspect_onnx(qdq_model(tmp_path / "q.onnx"))
    assert fp32.qdq_scale_types == ("float32",) and qdq_scale_refusal(fp32, "tensorrt", "8.5.3.1") is None
