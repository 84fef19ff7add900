"""The decoder split on a small real ONNX decoder shaped like the Whisper export: the cross-attention keys are
reshaped with the batch size read from the tokens' side (``Shape(x)[0]``), as the exporter does, and still
hoisted out of the per-token part with their Reshape and Transpose; the vocabulary projection then runs for the
last k positions only (k an input), and the full projection is gone from the graph. Same numbers as the whole
model for one sequence, and for a batch whose hoisted tensors are repeated."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgert.speech.decoder_split import LAST_LOGITS, TAIL, add_last_logits, split_decoder

ort = pytest.importorskip("onnxruntime")

V, D, F = 9, 4, 6  # vocabulary, width, audio frames


def toy_decoder() -> onnx.ModelProto:
    """tokens [b, n] + encoder_out [1, F, D] -> logits [b, n, V]: x = emb[tokens]; k = Reshape(enc @ W, [b, F, D])
    (b from Shape(x)[0]); h = x @ k^T; logits = Reshape(Gemm(Reshape(h, [-1, F]), P^T), [b, n, V])."""
    rng = np.random.default_rng(0)

    def init(name: str, a: np.ndarray) -> onnx.TensorProto:
        return helper.make_tensor(name, TensorProto.INT64 if a.dtype == np.int64 else TensorProto.FLOAT,
                                  list(a.shape), a.ravel().tolist())

    inits = [init("emb", rng.normal(size=(V, D)).astype(np.float32)),
             init("w", rng.normal(size=(D, D)).astype(np.float32)),
             init("p", rng.normal(size=(V, F)).astype(np.float32)),
             init("zero", np.array(0, dtype=np.int64)), init("one", np.array(1, dtype=np.int64)),
             init("axes0", np.array([0], dtype=np.int64)), init("fd", np.array([F, D], dtype=np.int64)),
             init("flat", np.array([-1, F], dtype=np.int64)), init("vocab", np.array([V], dtype=np.int64))]
    nodes = [
        helper.make_node("Gather", ["emb", "tokens"], ["x"]),
        helper.make_node("Shape", ["x"], ["xshape"]),
        helper.make_node("Gather", ["xshape", "zero"], ["b"]),  # the batch size, from the tokens' side
        helper.make_node("Gather", ["xshape", "one"], ["n"]),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["b1", "fd"], ["kshape"], axis=0),
        helper.make_node("MatMul", ["encoder_out", "w"], ["k0"]),
        helper.make_node("Reshape", ["k0", "kshape"], ["k"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "kt"], ["h"]),
        helper.make_node("Reshape", ["h", "flat"], ["h2"]),
        helper.make_node("Gemm", ["h2", "p"], ["proj"], transB=1),
        helper.make_node("Concat", ["b1", "n1", "vocab"], ["oshape"], axis=0),
        helper.make_node("Reshape", ["proj", "oshape"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "toy", [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "n"]),
                       helper.make_tensor_value_info("encoder_out", TensorProto.FLOAT, [1, F, D])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "n", V])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, feed)[0]
    return out


def test_batch_shaped_keys_are_hoisted_with_their_reshape_and_transpose() -> None:
    model = toy_decoder()
    split = split_decoder(model)
    assert split is not None
    cross, step, hoisted = split
    assert hoisted == ["kt"]  # after the Reshape and Transpose, which depend on the batch size alone
    assert {"Reshape", "Transpose", "MatMul"} <= {n.op_type for n in cross.graph.node}
    assert "Transpose" not in {n.op_type for n in step.graph.node}
    enc = np.random.default_rng(1).normal(size=(1, F, D)).astype(np.float32)
    (kt,) = ort.InferenceSession(cross.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {
        "encoder_out": enc})
    tokens = np.array([[1, 5, 7, 2]], dtype=np.int64)
    whole = run(model, {"tokens": tokens, "encoder_out": enc})
    np.testing.assert_allclose(run(step, {"tokens": tokens, "kt": kt}), whole, rtol=1e-6)
    # Two sequences: the hoisted keys repeated along the batch axis give each row its one-sequence logits.
    pair = np.array([[1, 5, 7, 2], [3, 3, 0, 8]], dtype=np.int64)
    both = run(step, {"tokens": pair, "kt": np.repeat(kt, 2, axis=0)})
    for i in range(2):
        np.testing.assert_allclose(both[i], run(model, {"tokens": pair[i : i + 1], "encoder_out": enc})[0],
                                   rtol=1e-5)


def test_the_projection_runs_for_the_last_k_positions_only() -> None:
    model = toy_decoder()
    split = split_decoder(model)
    assert split is not None
    _, step, _ = split
    enc = np.random.default_rng(2).normal(size=(1, F, D)).astype(np.float32)
    kt = np.transpose((enc @ onnx.numpy_helper.to_array(model.graph.initializer[1])), (0, 2, 1))
    tokens = np.array([[1, 5, 7, 2, 4]], dtype=np.int64)
    full = run(step, {"tokens": tokens, "kt": kt})[0]  # [n, V]
    assert add_last_logits(step) == LAST_LOGITS
    assert [o.name for o in step.graph.output] == [LAST_LOGITS]  # the full projection is no output any more
    assert [n.op_type for n in step.graph.node].count("Gemm") == 1  # ... and no node computes it
    for k in (1, 2, 5):
        tail = run(step, {"tokens": tokens, "kt": kt, TAIL: np.array([-k], dtype=np.int64)})
        np.testing.assert_allclose(tail.reshape(k, V), full[5 - k :], rtol=1e-6)
    pair = np.repeat(tokens, 2, axis=0)
    last = run(step, {"tokens": pair, "kt": np.repeat(kt, 2, axis=0), TAIL: np.array([-1], dtype=np.int64)})
    np.testing.assert_allclose(last.reshape(2, V), np.stack([full[-1], full[-1]]), rtol=1e-6)


def test_a_graph_without_a_projection_at_its_end_is_left_alone() -> None:
    model = toy_decoder()
    model.graph.node[-1].op_type = "Identity"  # logits = Identity(proj, ...): not a Reshape chain to a Gemm
    del model.graph.node[-1].input[1:]
    before = model.SerializeToString()
    assert add_last_logits(model) is None
    assert model.SerializeToString() == before
