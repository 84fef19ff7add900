"""Batch rewriting on tiny models built here and on the real detectors: the rewrite, its check, the cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.rewrite.batch import (
    BATCH_DIM,
    BatchRewriteError,
    batched_model_path,
    check_batch_rewrite,
    has_dynamic_batch,
    rewrite_batch,
)

pytest.importorskip("onnxruntime")


def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], in_shape: list[int],
           out_shape: list[int | str], name: str = "tiny") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    m = helper.make_model(helper.make_graph(nodes, name, [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def rewritable() -> onnx.ModelProto:
    """What exporters write at batch 1: constant reshapes with a leading 1, a Slice ending at 1 on axis 0,
    a batch-independent table concatenated to the data, and a reshape whose target is computed from Shape
    (already batch-proof)."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 3 * 16, dtype=np.float32).reshape(1, 16, 3), "w")
    table = numpy_helper.from_array(np.arange(16 * 2, dtype=np.float32).reshape(1, 16, 2), "table")
    nodes = [
        helper.make_node("Reshape", ["x", "s1"], ["r1"], name="Reshape_flat"),          # [1,3,4,4] -> [1,3,16]
        helper.make_node("Transpose", ["r1"], ["t1"], perm=[0, 2, 1]),                  # [1,16,3]
        helper.make_node("Mul", ["t1", "w"], ["m1"]),
        helper.make_node("Slice", ["m1", "st", "en", "ax"], ["sl"], name="Slice_all"),  # [0:1, :, 0:2]
        helper.make_node("Concat", ["sl", "table"], ["cat"], axis=2, name="Concat_table"),  # [1,16,4]
        helper.make_node("Unsqueeze", ["cat", "one"], ["u"]),                           # [1,1,16,4]
        helper.make_node("Squeeze", ["u", "one"], ["sq"]),                             # [1,16,4]
        helper.make_node("Reshape", ["sq", "s2"], ["r2"], name="Reshape_back"),        # [1,64]
        helper.make_node("Shape", ["r2"], ["shp"]),
        helper.make_node("Gather", ["shp", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "zero1"], ["b1"]),
        helper.make_node("Concat", ["b1", "m1d"], ["s3"], axis=0),
        helper.make_node("Reshape", ["r2", "s3"], ["y"], name="Reshape_dynamic"),      # [1, 64]
    ]
    inits = [_i64("s1", [1, 3, -1]), w, _i64("st", [0, 0]), _i64("en", [1, 2]), _i64("ax", [0, 2]), table,
             _i64("one", [1]), _i64("s2", [1, 64]), numpy_helper.from_array(np.array(0, np.int64), "zero"),
             _i64("zero1", [0]), _i64("m1d", [-1])]
    return _model(nodes, inits, [1, 3, 4, 4], [1, 64])


def folding() -> onnx.ModelProto:
    """A Reshape that drops the batch into the next dimension: [1, 3, 16] -> [3, 16]."""
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r1"], name="Reshape_fold"),
             helper.make_node("Relu", ["r1"], ["y"])]
    return _model(nodes, [_i64("s1", [3, 16])], [1, 3, 16], [3, 16], name="folding")


def test_rewritable_model_gets_a_symbolic_batch_and_same_rows() -> None:
    original = rewritable()
    res = rewrite_batch(original, label="tiny.onnx")
    m = res.model
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == BATCH_DIM
    assert m.graph.output[0].type.tensor_type.shape.dim[0].dim_param == BATCH_DIM
    assert has_dynamic_batch(m) and not has_dynamic_batch(original)
    changed = " ".join(res.changes)
    for name in ("Reshape_flat", "Slice_all", "Concat_table", "Reshape_back"):
        assert name in changed
    assert "Reshape_dynamic" not in changed  # its shape comes from Shape: right at every batch already
    checked = check_batch_rewrite(original, m, batches=(1, 2, 3, 5))
    assert [c["batch"] for c in checked] == [1, 2, 3, 5]
    assert all(c["max_rel_err"] <= 1e-4 for c in checked)
    # the check is not the only witness: compute one row by hand through ONNX Runtime
    import onnxruntime as ort

    x = np.random.default_rng(1).random((3, 3, 4, 4), dtype=np.float32)
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ref = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    assert got.shape == (3, 64)
    for r in range(3):
        np.testing.assert_allclose(got[r:r + 1], ref.run(None, {"x": x[r:r + 1]})[0], rtol=1e-6)


def test_folding_reshape_is_refused_naming_node_and_shapes() -> None:
    with pytest.raises(BatchRewriteError) as err:
        rewrite_batch(folding(), label="fold.onnx")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("fold.onnx: node Reshape_fold (Reshape) folds the batch into another dimension")
    assert "[1, 3, 16] -> [3, 16]" in msg
    assert err.value.node == "Reshape_fold"


def test_gather_reduce_and_squeeze_of_the_batch_are_refused() -> None:
    g = _model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="G")],
               [_i64("i", [0])], [1, 4], [1, 4])
    with pytest.raises(BatchRewriteError, match=r"node G \(Gather\) gathers along the batch axis"):
        rewrite_batch(g)
    r = _model([helper.make_node("ReduceMax", ["x"], ["y"], axes=[0, 1], keepdims=1, name="R")], [], [1, 4], [1, 1])
    with pytest.raises(BatchRewriteError, match=r"node R \(ReduceMax\) reduces over the batch axis"):
        rewrite_batch(r)
    q = _model([helper.make_node("Squeeze", ["x"], ["y"], name="Q")], [], [1, 1, 4], [4])
    with pytest.raises(BatchRewriteError, match=r"node Q \(Squeeze\) squeezes every dimension of size 1"):
        rewrite_batch(q)
    # "if batch == 1" in the graph: true at batch 1, false after; no rewrite can keep that
    e = _model([helper.make_node("Shape", ["x"], ["s"]),
                helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
                helper.make_node("Equal", ["b", "one"], ["eq"], name="E"),
                helper.make_node("Cast", ["eq"], ["f"], to=TensorProto.FLOAT),
                helper.make_node("Mul", ["x", "f"], ["y"])],
               [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                numpy_helper.from_array(np.array(1, np.int64), "one")], [1, 4], [1, 4])
    with pytest.raises(BatchRewriteError, match=r"node E \(Equal\) compares a shape value with one the batch"):
        rewrite_batch(e)
    # an If whose branch reads x from the outer scope: x is not among the If's inputs, still it is batched
    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "then", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "else", [],
                              [helper.make_tensor_value_info("n", TensorProto.FLOAT, [1, 4])])
    f = _model([helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other, name="I")],
               [numpy_helper.from_array(np.array(True), "c")], [1, 4], [1, 4])
    with pytest.raises(BatchRewriteError, match=r"node I \(If\) has a subgraph that reads the batch"):
        rewrite_batch(f)


def test_check_catches_a_wrong_rewrite() -> None:
    """A "rewrite" that equals the original at batch 1 but mixes rows at batch 2 must fail the check."""
    original = _model([helper.make_node("Relu", ["x"], ["y"])], [], [1, 4], [1, 4])
    # y = relu(x + (mean over the batch - x) / 2): relu(x) while the batch is one row, not after
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),
             helper.make_node("Sub", ["mean", "x"], ["d"]),
             helper.make_node("Mul", ["d", "half"], ["h"]),
             helper.make_node("Add", ["x", "h"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    wrong = helper.make_model(helper.make_graph(
        nodes, "wrong", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")]),
        opset_imports=[helper.make_opsetid("", 13)])
    wrong.ir_version = 8
    assert check_batch_rewrite(original, wrong, batches=(1,))[0]["max_rel_err"] < 1e-6
    with pytest.raises(BatchRewriteError, match=r"^wrong\.onnx: the batch rewrite changes output y at batch 2 row 0"):
        check_batch_rewrite(original, wrong, batches=(1, 2), label="wrong.onnx")


def _qdq(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], batch: int | str) -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear (per tensor) -> ``nodes`` -> y, at batch ``batch``."""
    q = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="Q"),
         helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="DQ")]
    m = helper.make_model(helper.make_graph(
        q + nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [numpy_helper.from_array(np.array(0.01, np.float32), "s"),
         numpy_helper.from_array(np.array(0, np.int8), "z"), *inits]), opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_quantized_models_are_checked_on_their_float_twins() -> None:
    """Rounding to INT8 turns the last-bit differences of another batch size's kernels into whole quantization
    steps (1.7 % on a YOLOv8s row on the device machine's Intel Xeon), so a Q/DQ model whose rewrite kept its
    Q/DQ nodes is checked on both models with the quantization taken out; a wrong rewrite is still caught, and
    one that touched a Q/DQ node is run as it is."""
    import edgert

    demo = Path(edgert.__file__).parent / "demo_data" / "nanodet-m-416-int8w.onnx"
    qdq = onnx.load(demo)
    res = rewrite_batch(qdq, label=demo.name)
    checked = check_batch_rewrite(qdq, res.model, batches=(1, 2))
    assert [c["compared"] for c in checked] == ["float twins (Q/DQ nodes unchanged)"] * 2
    assert all(c["max_rel_err"] < 1e-6 for c in checked)

    original = _qdq([helper.make_node("Relu", ["xd"], ["y"])], [], 1)
    mixing = [helper.make_node("ReduceMean", ["xd"], ["mean"], axes=[0], keepdims=1),
              helper.make_node("Sub", ["mean", "xd"], ["d"]), helper.make_node("Mul", ["d", "half"], ["h"]),
              helper.make_node("Add", ["xd", "h"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    wrong = _qdq(mixing, [numpy_helper.from_array(np.array(0.5, np.float32), "half")], "batch")
    assert check_batch_rewrite(original, wrong, batches=(1,))[0]["compared"].startswith("float twins")
    with pytest.raises(BatchRewriteError, match=r"^wrong\.onnx: the batch rewrite changes output y at batch 2"):
        check_batch_rewrite(original, wrong, batches=(1, 2), label="wrong.onnx")

    rescaled = _qdq([helper.make_node("Relu", ["xd"], ["y"])], [], "batch")
    rescaled.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(0.02, np.float32), "s"))
    with pytest.raises(BatchRewriteError, match=r"changes output y at batch 1 row 0"):
        check_batch_rewrite(original, rescaled, batches=(1, 2))
    right = _qdq([helper.make_node("Relu", ["xd"], ["y"])], [], "batch")
    int8_out = onnx.ModelProto()
    int8_out.CopyFrom(right)  # a QuantizeLinear read by another operator: no float twin, run as it is
    int8_out.graph.node.append(helper.make_node("Cast", ["xq"], ["xc"], to=TensorProto.FLOAT))
    assert {c["compared"] for c in check_batch_rewrite(original, int8_out, batches=(1, 2))} == {
        "Q/DQ as reference operators"}


def test_an_fp16_model_is_checked_to_fp16_precision() -> None:
    """A model that computes in FP16 (ModelOpt's default output) may differ in FP16's last bits between batch
    sizes; rows mixed by a wrong rewrite still fail."""
    def fp16(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], batch: int | str) -> onnx.ModelProto:
        m = helper.make_model(helper.make_graph(
            nodes, "fp16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [batch, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [batch, 4])], inits),
            opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        return m

    original = fp16([helper.make_node("Relu", ["x"], ["y"])], [], 1)
    last_bits = fp16([helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                     [numpy_helper.from_array(np.array(1.0 + 2 ** -10, np.float16), "k")], "batch")
    assert 5e-4 < check_batch_rewrite(original, last_bits, batches=(1, 2))[1]["max_rel_err"] < 2e-3
    mixing = fp16([helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),
                   helper.make_node("Add", ["x", "mean"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                  [], "batch")
    with pytest.raises(BatchRewriteError, match=r"changes output y at batch 1 row 0"):
        check_batch_rewrite(original, mixing, batches=(1, 2))


def test_cache_rewrites_once_and_remembers_failures(tmp_path: Path) -> None:
    src = tmp_path / "tiny.onnx"
    onnx.save(rewritable(), str(src))
    cache = tmp_path / "cache"
    out = batched_model_path(src, cache)
    assert out.parent == cache and out.suffix == ".onnx" and has_dynamic_batch(out)
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["check"] and record["changes"]
    mtime = out.stat().st_mtime_ns
    assert batched_model_path(src, cache) == out and out.stat().st_mtime_ns == mtime  # reused, not rewritten
    # a damaged cached model is rewritten, not trusted
    out.write_bytes(b"junk")
    assert batched_model_path(src, cache) == out and has_dynamic_batch(out)
    # a model with a dynamic batch already is its own answer
    dyn = tmp_path / "dyn.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [], ["batch", 4], ["batch", 4]), str(dyn))  # type: ignore[list-item]
    assert batched_model_path(dyn, cache) == dyn
    # failures are recorded and raised again without redoing the analysis
    bad = tmp_path / "fold.onnx"
    onnx.save(folding(), str(bad))
    with pytest.raises(BatchRewriteError, match=r"^fold\.onnx: node Reshape_fold"):
        batched_model_path(bad, cache)
    rec = next(p for p in cache.glob("fold-*.json"))
    assert "Reshape_fold" in json.loads(rec.read_text())["error"]
    assert not list(cache.glob("fold-*.onnx"))
    with pytest.raises(BatchRewriteError, match="Reshape_fold"):
        batched_model_path(bad, cache)


DETECTORS = ("yolov8s-fall-640.onnx", "nanodet-m-416-coco-v8layout.onnx", "yolov3-tiny-coco-416.onnx")


@pytest.mark.parametrize("name", DETECTORS)
def test_real_detectors_rewrite_and_check(assets: Path, name: str) -> None:
    path = assets / "models" / "detection" / name
    if not path.exists():
        pytest.skip(f"{path} not in the assets")
    res = rewrite_batch(path)
    assert res.changes and has_dynamic_batch(res.model)
    checked = check_batch_rewrite(path, res.model, batches=(1, 3))
    assert all(c["max_rel_err"] <= 1e-4 for c in checked)


def test_rewrite_stays_off_the_builder() -> None:
    """The runtime imports this module; it must not pull in the builder (TensorRT) or ONNX Runtime at import."""
    import subprocess
    import sys

    code = ("import sys, edgert.rewrite.batch; "
            "print(sorted(m for m in sys.modules if m.startswith(('edgert.builder', 'onnxruntime', 'tensorrt'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_resize_sizes_become_scales_and_torch_shape_guards_are_followed() -> None:
    """Resize with ``sizes`` [1,C,2H,2W] pins the batch; and a torch-style reshape target built as
    Where(Equal(shape, -1), 1, shape) from Shape values needs no patch at all."""
    nodes = [
        helper.make_node("Resize", ["x", "", "", "sizes"], ["up"], mode="nearest", name="Resize_sizes"),
        helper.make_node("Shape", ["up"], ["shp"]),
        helper.make_node("Equal", ["shp", "minus1"], ["eq"]),
        helper.make_node("Where", ["eq", "ones", "shp"], ["target"]),
        helper.make_node("Expand", ["bias", "target"], ["b"], name="Expand_shape"),
        helper.make_node("Add", ["up", "b"], ["y"]),
    ]
    inits = [_i64("sizes", [1, 2, 6, 8]), _i64("minus1", [-1]), _i64("ones", [1, 1, 1, 1]),
             numpy_helper.from_array(np.array([[[[0.5]], [[-1.0]]]], np.float32), "bias")]
    original = _model(nodes, inits, [1, 2, 3, 4], [1, 2, 6, 8], name="resize")
    res = rewrite_batch(original)
    assert any("Resize_sizes" in c and "scales" in c for c in res.changes), res.changes
    assert not any("Expand_shape" in c for c in res.changes)
    assert all(c["max_rel_err"] == 0.0 for c in check_batch_rewrite(original, res.model, batches=(1, 2, 3)))
    # uneven ratios (7/3, 9/7) too: the scale is what ONNX Runtime derives from the sizes itself
    odd = _model([helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="linear", name="R")],
                 [_i64("sz", [1, 2, 7, 9])], [1, 2, 3, 7], [1, 2, 7, 9])
    assert all(c["max_rel_err"] <= 1e-6 for c in check_batch_rewrite(odd, rewrite_batch(odd).model, batches=(1, 2)))


def test_batch_moving_to_another_index_gets_the_one_wildcard() -> None:
    """Batch at axis 2 of [2, 3, 1, 8] reshaped to [6, 1, -1]: it lands at axis 1, where ``0`` would copy the
    wrong dim, so the target becomes [6, -1, 8] (the old wildcard resolved to its size)."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 0, 3]),          # [2,3,1,8], batch at 2
             helper.make_node("Reshape", ["t", "s"], ["r"], name="Reshape_move"),      # [6,1,8], batch at 1
             helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0, 2])]              # [1,6,8]
    original = _model(nodes, [_i64("s", [6, 1, -1])], [1, 2, 3, 8], [1, 6, 8])
    res = rewrite_batch(original)
    assert res.changes == ("Reshape_move (Reshape): shape [6, 1, -1] -> [6, -1, 8]",)
    assert all(c["max_rel_err"] == 0.0 for c in check_batch_rewrite(original, res.model, batches=(1, 2, 5)))
