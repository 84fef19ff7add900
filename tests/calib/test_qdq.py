"""Q/DQ placement and the written model, on tiny real ONNX models run in ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from edgert.calib.collect import ActivationCollector
from edgert.calib.qdq import plan_quantization, prepare_model, quantize_weight, write_qdq

from .models import tiny_detector, tiny_gemm

ort = pytest.importorskip("onnxruntime")


def _calibrated(model: onnx.ModelProto, samples: list[np.ndarray], method: str = "minmax") -> dict[str, float]:
    plan = plan_quantization(model)
    col = ActivationCollector(model, [t for t in plan.activation_tensors if t not in plan.tail_tensors])
    for s in samples:
        col.update(s)
    return {n: h.amax(method) for n, h in col.histograms.items()}  # type: ignore[arg-type]


def _consumers(model: onnx.ModelProto, tensor: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if tensor in n.input]


def _inputs(n: int = 6, size: int = 32, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(0, 1, (1, 3, size, size)).astype(np.float32) for _ in range(n)]


def test_placement_on_a_detector_keeps_the_decoding_tail_float(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "d.onnx"))))
    plan = plan_quantization(model)
    assert [t.node for t in plan.targets] == ["conv1", "conv2", "head_conv"]
    assert {"reshape", "split", "box_relu", "box_mul", "box_add", "cls_sigmoid", "concat"} == set(plan.tail_nodes)
    assert plan.skipped.get("box_add") == "decoding tail (after the last Conv)"
    assert "images" in plan.quantized_tensors and "r1" in plan.quantized_tensors

    samples = _inputs()
    qdq = write_qdq(model, plan, _calibrated(model, samples))
    onnx.checker.check_model(qdq)
    ops = [n.op_type for n in qdq.graph.node]
    assert ops.count("QuantizeLinear") == 3 and ops.count("DequantizeLinear") == 6  # 3 activations + 3 weights
    inits = {i.name: i for i in qdq.graph.initializer}
    for node in qdq.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zp = numpy_helper.to_array(inits[node.input[2]])
            assert zp.dtype == np.int8 and not zp.any()  # symmetric INT8: TensorRT rejects other zero points
        if node.op_type == "Conv":
            assert node.input[0].endswith("_DequantizeLinear") and node.input[1].endswith("_DequantizeLinear")
            assert inits[node.input[2]].data_type == TensorProto.FLOAT  # float bias, never INT32
    weight_dq = [n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert all(inits[n.input[0]].data_type == TensorProto.INT8 for n in weight_dq)
    assert all(next(a.i for a in n.attribute if a.name == "axis") == 0 for n in weight_dq)
    assert "w1" not in inits  # the float copy of quantized weights is dropped
    # nothing quantized after the head: every tail node reads float tensors
    for name in plan.tail_nodes:
        node = next(n for n in qdq.graph.node if n.name == name)
        assert not any(i.endswith("_DequantizeLinear") for i in node.input)
    assert qdq.graph.output[0].name == "output0"

    ref = ort.InferenceSession(model.SerializeToString())
    sess = ort.InferenceSession(qdq.SerializeToString())
    x = _inputs(1, seed=9)[0]
    a, b = ref.run(None, {"images": x})[0], sess.run(None, {"images": x})[0]
    assert a.shape == b.shape
    cls_err = np.abs(a[:, 4:] - b[:, 4:]).max()
    assert cls_err < 0.05, cls_err  # scores in 0..1 survive because the tail is float


def test_neg_inf_padding_stays_float_and_does_not_poison_ranges(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "d.onnx", neg_inf_pad=True))))
    plan = plan_quantization(model)
    assert plan.nonfinite_tensors == {"padded"}
    assert plan.skipped["pool"] == "input holds non-finite padding (-inf)"
    assert "padded" not in plan.cache_tensors()
    amax = _calibrated(model, _inputs(), "entropy")
    assert all(np.isfinite(v) for v in amax.values())
    qdq = write_qdq(model, plan, amax)
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "padded" for n in qdq.graph.node)
    out = ort.InferenceSession(qdq.SerializeToString()).run(None, {"images": _inputs(1)[0]})[0]
    assert np.isfinite(out).all()


def test_residual_add_quantizes_only_the_skip_branch(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "d.onnx", residual=True))))
    plan = plan_quantization(model)
    add = next(t for t in plan.targets if t.node == "residual_add")
    assert add.activations == ("r2",)  # c3 comes from a Conv: TensorRT fuses the Add into it
    qdq = write_qdq(model, plan, _calibrated(model, _inputs()))
    add_node = next(n for n in qdq.graph.node if n.name == "residual_add")
    assert add_node.input[0] == "c3" and add_node.input[1].endswith("_DequantizeLinear")
    ort.InferenceSession(qdq.SerializeToString()).run(None, {"images": _inputs(1)[0]})


def test_residual_add_after_a_conv_and_its_silu_quantizes_the_skip_branch(tmp_path: Path) -> None:
    """YOLOv5/v8 shortcuts add ``Conv -> Sigmoid -> Mul`` (SiLU, which TensorRT fuses into the Conv) to the
    block's input: the skip branch is quantized so the fused Conv emits INT8, as after a bare Conv."""
    from onnx import helper

    proto = onnx.load(str(tiny_detector(tmp_path / "d.onnx", residual=True)))
    nodes = list(proto.graph.node)
    at = next(k for k, n in enumerate(nodes) if n.name == "residual_add")
    nodes[at].input[0] = "c3_silu"
    nodes[at:at] = [helper.make_node("Sigmoid", ["c3"], ["c3_gate"], name="c3_sigmoid"),
                    helper.make_node("Mul", ["c3", "c3_gate"], ["c3_silu"], name="c3_mul")]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    model = prepare_model(proto)
    add = next(t for t in plan_quantization(model).targets if t.node == "residual_add")
    assert add.activations == ("r2",)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_models_without_convs_anchor_on_matmuls(tmp_path: Path, trans_b: int) -> None:
    model = prepare_model(onnx.load(str(tiny_gemm(tmp_path / "g.onnx", trans_b))))
    plan = plan_quantization(model)
    gemm = next(t for t in plan.targets if t.node == "gemm")
    assert gemm.weight == "wg" and gemm.weight_axis == (0 if trans_b else 1)  # per output channel
    matmul = next(t for t in plan.targets if t.node == "matmul")
    assert matmul.weight == "wm" and matmul.weight_axis == 1 and matmul.activations == ("r",)
    assert plan.tail_nodes == ["tail_sigmoid"]
    rng = np.random.default_rng(0)
    samples = [rng.normal(0, 1, (1, 48)).astype(np.float32) for _ in range(4)]
    qdq = write_qdq(model, plan, _calibrated(model, samples))
    weight_dq = next(n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("wg"))
    scale_name = weight_dq.input[1]
    scale = numpy_helper.to_array(next(i for i in qdq.graph.initializer if i.name == scale_name))
    assert scale.shape == (5,)
    a = ort.InferenceSession(model.SerializeToString()).run(None, {"x": samples[0]})[0]
    b = ort.InferenceSession(qdq.SerializeToString()).run(None, {"x": samples[0]})[0]
    assert np.allclose(a, b, atol=0.1 * np.abs(a).max() + 1e-3)


def test_excluded_layers_stay_float(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "d.onnx"))))
    plan = plan_quantization(model)
    qdq = write_qdq(model, plan, _calibrated(model, _inputs()), exclude_nodes=["conv2"])
    conv2 = next(n for n in qdq.graph.node if n.name == "conv2")
    assert list(conv2.input) == ["r1", "w2", "b2"]
    assert any(i.name == "w2" for i in qdq.graph.initializer)


def test_weight_quantization_is_symmetric_per_channel() -> None:
    w = np.array([[[[1.0, -0.5]]], [[[0.01, 0.02]]], [[[0.0, 0.0]]]], np.float32)
    q, scale = quantize_weight(w, 0)
    assert q.dtype == np.int8 and scale.shape == (3,)
    assert q[0].max() == 127 and q[1].max() == 127  # each channel uses its full range
    assert not q[2].any() and scale[2] > 0  # all-zero channel: exact, with a usable scale
    assert np.abs(q.astype(np.float32) * scale.reshape(-1, 1, 1, 1) - w).max() <= scale.max() / 2 + 1e-7


def test_old_opset_is_raised_to_13_for_per_channel_scales(tmp_path: Path) -> None:
    path = tiny_gemm(tmp_path / "g.onnx")
    m = onnx.load(str(path))
    m.opset_import[0].version = 11  # Gemm/MatMul/Relu/Sigmoid are the same in 11 and 13
    prepared = prepare_model(m)
    assert next(i.version for i in prepared.opset_import if i.domain in ("", "ai.onnx")) >= 13


def test_a_conv_reading_a_softmax_is_decoding_not_a_layer(tmp_path: Path) -> None:
    """YOLOv8's DFL: head conv -> reshape -> softmax over 16 bins -> 1x1 conv with weights 0..15."""
    from onnx import helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (64, 3, 3, 3)).astype(np.float32), "wh"),
        numpy_helper.from_array(np.array([1, 4, 16, 64], np.int64), "shape1"),
        numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1), "wdfl"),
        numpy_helper.from_array(np.array([1, 4, 64], np.int64), "shape2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "wh"], ["h"], name="head", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Reshape", ["h", "shape1"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Softmax", ["t"], ["p"], name="softmax", axis=1),
        helper.make_node("Conv", ["p", "wdfl"], ["d"], name="dfl"),
        helper.make_node("Reshape", ["d", "shape2"], ["y"], name="out"),
    ]
    graph = helper.make_graph(nodes, "dfl", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    plan = plan_quantization(prepare_model(model))
    assert [t.node for t in plan.targets] == ["head"]
    assert {"softmax", "dfl", "out"} <= set(plan.tail_nodes)


def test_collecting_in_chunks_of_tensors_gives_the_same_histograms(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "d.onnx"))))
    plan = plan_quantization(model)
    tensors = [t for t in plan.activation_tensors if t not in plan.tail_tensors]
    whole = ActivationCollector(model, tensors)
    chunked = ActivationCollector(model, tensors, budget_mb=0.004)  # ~4 KiB per run: one tensor at a time
    assert len(whole.chunks) == 1 and len(chunked.chunks) == len(tensors)
    for x in _inputs(3):
        whole.update(x)
        chunked.update(x)
    for name in tensors:
        assert np.array_equal(whole.histograms[name].counts, chunked.histograms[name].counts)
        assert whole.histograms[name].range == chunked.histograms[name].range
