"""Constant folding ahead of a TensorRT 8.x Q/DQ build: yolov3-tiny's decoding computes ``Mul(Reciprocal(c1), c2)``
from two Constant nodes, which 8.5's Q/DQ optimizer does not finish on (docs/results/trt85-int8-qdq-loop-*.json).
Folded, the outputs are the model's to the bit; Q/DQ, control flow, big results and graph outputs stay."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.rewrite.fold import constant_nodes, fold_constants

ort = pytest.importorskip("onnxruntime")


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _qdq_model(extra: list[onnx.NodeProto] | None = None, outputs: tuple[str, ...] = ("y",)) -> onnx.ModelProto:
    """A quantized conv whose result is scaled by ``1 / c1 * c2`` (constants alone), as yolov3-tiny's decoding is."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 3, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.full((4,), 0.05, np.float32), "ws"),
             numpy_helper.from_array(np.zeros((4,), np.int8), "wz"),
             numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             numpy_helper.from_array(np.array(0, np.int8), "xz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], axis=0),  # ModelOpt's form
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"]),
             _const("c1", np.array(8.0, np.float32)), _const("c2", np.array(3.0, np.float32)),
             helper.make_node("Reciprocal", ["c1"], ["r"]), helper.make_node("Mul", ["r", "c2"], ["k"]),
             helper.make_node("Mul", ["c", "k"], ["y"]), *(extra or [])]
    value = {"y": [1, 4, 8, 8]}
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, value.get(o)) for o in outputs]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_constant_pointwise_nodes_fold_and_qdq_stays() -> None:
    model = _qdq_model()
    x = np.random.default_rng(1).random((1, 3, 8, 8), dtype=np.float32)
    want = _run(model, {"x": x})
    assert [n.op_type for n in constant_nodes(model)] == ["Reciprocal", "Mul"]
    assert fold_constants(model) == 2
    onnx.checker.check_model(model)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops == {"QuantizeLinear": 2, "DequantizeLinear": 2, "Conv": 1, "Mul": 1}  # the Constant nodes too
    k = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}["k"]
    assert k == np.float32(3.0 / 8.0) and "w" in {t.name for t in model.graph.initializer}  # the Q's weight stays
    assert np.array_equal(_run(model, {"x": x})[0], want[0])
    assert constant_nodes(model) == [] and fold_constants(model) == 0


def test_results_over_the_size_limit_and_graph_outputs_stay() -> None:
    big = helper.make_node("ConstantOfShape", ["shape"], ["big"], value=helper.make_tensor("v", TensorProto.FLOAT,
                                                                                           [1], [1.0]))
    model = _qdq_model([_const("shape", np.array([1024, 1024, 2], np.int64)), big,
                        helper.make_node("ReduceMax", ["big"], ["m"], keepdims=0),
                        helper.make_node("Mul", ["y", "m"], ["y2"]),
                        helper.make_node("Neg", ["c2"], ["negated"])], outputs=("y2", "negated"))
    assert fold_constants(model) == 2  # Reciprocal and Mul; ConstantOfShape would make 8 MiB, Neg is an output
    assert {n.op_type for n in model.graph.node} >= {"ConstantOfShape", "ReduceMax", "Neg"}
    assert fold_constants(model, max_bytes=16 << 20) == 2  # once allowed: the big one, and what reads it
    assert "big" not in {t.name for t in model.graph.initializer}  # only the reduction stays


def test_an_op_the_evaluator_cannot_run_stays_with_what_reads_it() -> None:
    model = _qdq_model()
    odd = helper.make_node("Reciprocal", ["c1"], ["r"])
    odd.domain = "com.example"  # a custom op: never evaluated here
    nodes = [odd if n.op_type == "Reciprocal" else n for n in model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    assert fold_constants(model) == 0
    assert [n.op_type for n in model.graph.node].count("Constant") == 2  # nothing changed


def test_a_value_read_only_inside_a_branch_stays() -> None:
    # an If's branch reads the outer "k" (folded from the Reciprocal and Mul) and "bias" (an initializer no outer
    # node reads): both must stay in the graph for the branch to run
    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["y", "k"], ["t"]),
                                  helper.make_node("Add", ["t", "bias"], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1, 4, 8, 8])])

    model = _qdq_model([helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                        helper.make_node("Greater", ["mx", "xz_f"], ["cond"]),
                        helper.make_node("If", ["cond"], ["z"], then_branch=branch("then", "Mul"),
                                         else_branch=branch("else", "Sub"))], outputs=("z",))
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0.5, np.float32), "xz_f"),
                                    numpy_helper.from_array(np.full((1, 4, 1, 1), 0.25, np.float32), "bias")])
    x = np.random.default_rng(2).random((1, 3, 8, 8), dtype=np.float32)
    want = _run(model, {"x": x})
    assert fold_constants(model) == 2
    assert {"k", "bias"} <= {t.name for t in model.graph.initializer}
    assert np.array_equal(_run(model, {"x": x})[0], want[0])


def test_yolov3_tiny_decoding_folds_to_the_same_outputs(assets: Path) -> None:
    src = assets / "models" / "detection" / "yolov3-tiny-coco-416.onnx"
    model = onnx.load(str(src))
    names = {n.name for n in constant_nodes(model)}
    assert {"/Reciprocal_1", "/Mul_3"} <= names and "/Reciprocal" not in names  # that one reads the input's shape
    x = np.random.default_rng(0).random((1, 3, 416, 416), dtype=np.float32)
    want = _run(model, {"images": x})
    assert fold_constants(model) == len(names)
    assert not [n for n in model.graph.node if n.name == "/Reciprocal_1"]
    for got, ref in zip(_run(model, {"images": x}), want):
        assert np.array_equal(got, ref)
