"""The folded copy a refused ONNX is retried with: NanoDet's run-time shape computation (ScatterND into a Reshape,
which TensorRT 8.5's parser rejects: seen on an H100 with 8.5.3.1) is folded away, Q/DQ pairs stay, the outputs
stay the model's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgert.builder.engine_builder import BuildOptions, _folded_onnx
from edgert.builder.onnx_info import inspect_onnx

ort = pytest.importorskip("onnxruntime")


def _ops(path: Path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_nanodet_shape_scatter_is_folded_and_outputs_kept(assets: Path, tmp_path: Path) -> None:
    src = assets / "models" / "detection" / "nanodet-m-416-coco-v8layout.onnx"
    folded = _folded_onnx(inspect_onnx(src), BuildOptions(cache_dir=tmp_path))
    assert folded is not None and folded.path.parent == tmp_path / "folded"
    assert _ops(src)["ScatterND"] == 1 and _ops(folded.path)["ScatterND"] == 0
    assert {o.domain for o in onnx.load(str(folded.path)).opset_import} <= {"", "ai.onnx"}
    x = np.random.default_rng(0).random((1, 3, 416, 416), dtype=np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]
    got = ort.InferenceSession(str(folded.path), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]
    assert np.allclose(got, want, atol=1e-3)
    again = _folded_onnx(inspect_onnx(src), BuildOptions(cache_dir=tmp_path))
    assert again is not None and again.path == folded.path  # cached


def test_qdq_pairs_survive_folding(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), dtype=np.int8), "w")
    s = numpy_helper.from_array(np.full((4,), 0.1, dtype=np.float32), "s")
    sx = numpy_helper.from_array(np.array(0.02, dtype=np.float32), "sx")
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, s, sx])
    model = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(model))
    folded = _folded_onnx(inspect_onnx(model), BuildOptions(cache_dir=tmp_path))
    assert folded is not None
    ops = _ops(folded.path)
    assert ops["QuantizeLinear"] == 1 and ops["DequantizeLinear"] == 2


def _qdq_with_constant_tail(path: Path) -> Path:
    """A quantized conv scaled by ``1 / c1`` of a Constant: the shape of node TensorRT 8.5's Q/DQ optimizer does
    not finish on (yolov3-tiny's decoding)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.ones((4, 3, 1, 1), dtype=np.int8), "w"),
             numpy_helper.from_array(np.full((4,), 0.1, dtype=np.float32), "s"),
             numpy_helper.from_array(np.array(0.02, dtype=np.float32), "sx")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"]),
             helper.make_node("Constant", [], ["c1"], value=numpy_helper.from_array(np.array(4.0, np.float32), "c1")),
             helper.make_node("Reciprocal", ["c1"], ["r"]),
             helper.make_node("Mul", ["c", "r"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_qdq_models_are_folded_for_tensorrt_8_only(assets: Path, tmp_path: Path) -> None:
    from edgert.builder.engine_builder import folds_constants

    qdq = inspect_onnx(_qdq_with_constant_tail(tmp_path / "qdq.onnx"))
    fp32 = inspect_onnx(assets / "models" / "detection" / "yolov3-tiny-coco-416.onnx")
    assert folds_constants("tensorrt", "8.5.3.1", qdq)
    assert not folds_constants("tensorrt", "10.13.0.35", qdq)  # its optimizer has no such loop on record
    assert not folds_constants("tensorrt-rtx", "1.7.1.116", qdq)
    assert not folds_constants("tensorrt", "8.5.3.1", fp32)  # its FP16/FP32 builds finish as they are


def test_constant_folded_copy_is_cached_and_keeps_qdq(tmp_path: Path) -> None:
    from edgert.builder.engine_builder import _constants_folded

    src = _qdq_with_constant_tail(tmp_path / "qdq.onnx")
    folded = _constants_folded(inspect_onnx(src), BuildOptions(cache_dir=tmp_path))
    assert folded.path.parent == tmp_path / "folded" and folded.has_qdq
    ops = _ops(folded.path)
    assert ops["Reciprocal"] == 0 and ops["Constant"] == 0 and ops["QuantizeLinear"] == 1
    assert ops["DequantizeLinear"] == 2
    x = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)
    run = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
           for p in (src, folded.path)]
    assert np.array_equal(run[0], run[1])
    stamp = folded.path.stat().st_mtime_ns
    assert _constants_folded(inspect_onnx(src), BuildOptions(cache_dir=tmp_path)).path == folded.path
    assert folded.path.stat().st_mtime_ns == stamp  # read from the cache, not written again
    # nothing to fold: the model itself, and no copy
    plain = _folded_onnx(inspect_onnx(src), BuildOptions(cache_dir=tmp_path / "b"))
    assert plain is not None
    assert _constants_folded(plain, BuildOptions(cache_dir=tmp_path / "c")).path == plain.path
    assert not (tmp_path / "c").exists()
