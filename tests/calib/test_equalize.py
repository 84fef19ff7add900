"""Activation equalisation on tiny models built here: FP32 outputs unchanged, per-channel ranges flatter,
and regions with an op that does not commute with a per-channel scale (SiLU, an Add) left alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.calib.collect import ActivationCollector
from edgert.calib.equalize import channel_absmax, equalize, find_regions
from edgert.calib.qdq import prepare_model
from tests.helpers import run_cli

from .models import tiny_detector, write_images

ort = pytest.importorskip("onnxruntime")


def _model(between: str = "leaky", b_reads: str = "pooled") -> onnx.ModelProto:
    """x -> conv_a -> (LeakyRelu | SiLU) -> MaxPool -> pooled; pooled -> conv_b and conv_c (two consumers);
    conv_d -> Relu -> Concat(pooled, .) -> conv_e. conv_a's rows span 1000x in size, so its channels do too.
    ``b_reads="add"``: conv_b reads pooled + pooled instead (an Add, which cannot absorb a scale)."""
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int, rows: np.ndarray | None = None) -> onnx.TensorProto:
        arr = rng.normal(0, 0.3, shape).astype(np.float32)
        if rows is not None:
            arr *= rows.reshape((-1,) + (1,) * (len(shape) - 1)).astype(np.float32)
        return numpy_helper.from_array(arr, name)

    spread = np.logspace(-1.5, 1.5, 6)
    inits = [w("wa", 6, 3, 3, 3, rows=spread), w("ba", 6, rows=spread), w("wb", 4, 6, 1, 1), w("bb", 4),
             w("wc", 5, 6, 3, 3), w("wd", 2, 3, 1, 1), w("bd", 2), w("we", 3, 8, 1, 1)]
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], name="conv_a", pads=[1, 1, 1, 1])]
    if between == "leaky":
        nodes.append(helper.make_node("LeakyRelu", ["a"], ["act"], name="act", alpha=0.1))
    else:  # SiLU: x * sigmoid(x), not positively homogeneous
        nodes += [helper.make_node("Sigmoid", ["a"], ["sig"], name="sig"),
                  helper.make_node("Mul", ["a", "sig"], ["act"], name="silu")]
    nodes.append(helper.make_node("MaxPool", ["act"], ["pooled"], name="pool", kernel_shape=[2, 2], strides=[2, 2]))
    b_in = "pooled"
    if b_reads == "add":
        nodes.append(helper.make_node("Add", ["pooled", "pooled"], ["twice"], name="add"))
        b_in = "twice"
    nodes += [
        helper.make_node("Conv", [b_in, "wb", "bb"], ["yb"], name="conv_b"),
        helper.make_node("Conv", ["pooled", "wc"], ["yc"], name="conv_c", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wd", "bd"], ["d"], name="conv_d", strides=[2, 2]),
        helper.make_node("Relu", ["d"], ["rd"], name="relu_d"),
        helper.make_node("Concat", ["pooled", "rd"], ["cat"], name="cat", axis=1),
        helper.make_node("Conv", ["cat", "we"], ["ye"], name="conv_e"),
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("yb", "yc", "ye")]
    graph = helper.make_graph(nodes, "eq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              outs, inits)
    return prepare_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _feeds(n: int = 6) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32) for _ in range(n)]


def _channel_max(model: onnx.ModelProto, tensors: list[str]) -> dict[str, np.ndarray]:
    c = ActivationCollector(model, tensors, channel_tensors=tensors)
    for x in _feeds():
        c.update(x)
    return c.channel_max


def _outputs(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in sess.run(None, {"x": x})]


def test_equalisation_keeps_fp32_outputs_and_flattens_the_channels() -> None:
    model = _model()
    (region,) = [r for r in find_regions(model) if r.why_not is None]
    assert sorted(region.sources) == ["conv_a", "conv_d"]
    assert sorted(region.absorbers) == ["conv_b", "conv_c", "conv_e"]
    assert region.segments["cat"] == [("conv_a", 0, 6), ("conv_d", 0, 2)]
    tensors = ["act", "pooled", "cat"]
    before = _channel_max(model, tensors)
    for alpha in (0.5, 1.0):
        eq, summary = equalize(model, find_regions(model), before, alpha)
        assert summary["rescaled_tensors"] == sorted(region.segments)
        for x in _feeds(3):
            for ref, got in zip(_outputs(model, x), _outputs(eq, x)):
                assert np.abs(ref - got).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
        after = _channel_max(eq, tensors)
        for t in tensors:
            flat_before = before[t].min() / before[t].max()
            flat_after = after[t].min() / after[t].max()
            assert flat_before < 0.05, t  # conv_a's rows span 1000x
            assert flat_after > (0.95 if alpha == 1.0 else 4 * flat_before), (t, alpha, flat_after)


def test_weight_equalisation_needs_no_data_and_is_exact_too() -> None:
    model = _model()
    eq, summary = equalize(model, find_regions(model), {}, 0.5, ranges="weights")
    assert summary["ranges"] == "weights" and len(summary["regions"]) == 1
    for x in _feeds(3):
        for ref, got in zip(_outputs(model, x), _outputs(eq, x)):
            assert np.abs(ref - got).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    before, after = _channel_max(model, ["pooled"])["pooled"], _channel_max(eq, ["pooled"])["pooled"]
    assert after.min() / after.max() > 4 * before.min() / before.max()  # conv_a's rows set its channels' ranges


@pytest.mark.parametrize(("between", "b_reads", "why"), [
    ("silu", "pooled", "a feeds Sigmoid sig"),  # SiLU(s x) != s SiLU(x)
    ("leaky", "add", "pooled feeds Add add"),  # the Add's other consumer cannot absorb the scale
])
def test_a_region_that_cannot_absorb_the_scale_is_left_alone(between: str, b_reads: str, why: str) -> None:
    model = _model(between, b_reads)
    regions = find_regions(model)
    blocked = [r for r in regions if "conv_a" in r.sources]
    assert len(blocked) == 1 and blocked[0].why_not == why
    eq, summary = equalize(model, regions, _channel_max(model, ["pooled"]), 1.0)
    assert summary["rescaled_tensors"] == [] and summary["regions"] == []
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for i in eq.graph.initializer:
        assert np.array_equal(numpy_helper.to_array(i), inits[i.name]), i.name


def test_calibrate_equalises_the_qdq_model_and_keeps_the_cache_for_the_model_as_given(tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    folder = tmp_path / "imgs"
    write_images(folder, 3)
    model = tiny_detector(tmp_path / "det.onnx", neg_inf_pad=True)
    outs = {}
    for mode in ("none", "weights"):
        out = tmp_path / mode / "det.int8.onnx"
        r = run_cli("calibrate", str(model), "--images", str(folder), "--num", "3", "--no-check", "--trt-version",
                    "8.6.2", "--equalize", mode, "-o", str(out))
        assert r.returncode == 0, r.stderr
        outs[mode] = out
    assert "equalised    weights (alpha 0.5): 2 convs rescaled in 2 regions" in r.stdout
    report = json.loads(outs["weights"].with_suffix(".report.json").read_text())
    eq = report["equalization"]
    assert eq["alpha"] == 0.5
    # conv1 -> Relu -> -inf Pad -> MaxPool -> conv2, and conv2 -> Relu -> head_conv (float: decoding tail)
    assert [(x["sources"], x["absorbers"]) for x in eq["regions"]] == [(["conv1"], ["conv2"]),
                                                                        (["conv2"], ["head_conv"])]
    # the Q/DQ model holds the rescaled weights (conv1's per-channel INT8 scales moved), and the TensorRT
    # cache (for the FP32 model as given, which trtexec --calib reads) is the same as without equalisation
    def weight_scales(path: Path) -> np.ndarray:
        m = onnx.load(str(path))
        return numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "w1_scale"))
    assert not np.allclose(weight_scales(outs["none"]), weight_scales(outs["weights"]), rtol=1e-3)
    assert outs["none"].with_suffix(".calib").read_text() == outs["weights"].with_suffix(".calib").read_text()
    # activation equalisation was measured and not kept: the command line does not offer it
    r = run_cli("calibrate", str(model), "--images", str(folder), "--equalize", "activations", "-o",
                str(tmp_path / "x.onnx"))
    assert r.returncode == 2 and "invalid choice: 'activations'" in r.stderr


def test_channel_absmax_is_the_largest_finite_magnitude_per_channel() -> None:
    x = np.zeros((2, 3, 4, 4), np.float32)
    x[1, 0, 2, 3] = -7.0  # a negative value is the largest magnitude of channel 0
    x[0, 1, 0, 0] = 2.5
    x[0, 2, :, 0] = -np.inf  # -inf padding: ignored
    x[1, 2, 3, 3] = 0.5
    assert channel_absmax(x).tolist() == [7.0, 2.5, 0.5]


def _chain() -> onnx.ModelProto:
    """x -> conv1 -> LeakyRelu -> conv2 -> LeakyRelu -> conv3: conv2 absorbs the first region's scales and is
    the source of the second's, so a pass over the graph changes what the pass before balanced."""
    rng = np.random.default_rng(2)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        arr = rng.normal(0, 0.3, shape) * np.logspace(-1, 1, shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
        return numpy_helper.from_array(arr.astype(np.float32), name)

    inits = [w("w1", 6, 3, 3, 3), w("b1", 6), w("w2", 5, 6, 3, 3), w("b2", 5), w("w3", 4, 5, 1, 1)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["h1"], ["a1"], name="act1", alpha=0.1),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["h2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["h2"], ["a2"], name="act2", alpha=0.1),
             helper.make_node("Conv", ["a2", "w3"], ["y"], name="conv3")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return prepare_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def test_weight_equalisation_passes_converge_exactly_in_float() -> None:
    model = _chain()
    regions = find_regions(model)
    assert [sorted(r.sources) for r in regions if r.why_not is None] == [["conv1"], ["conv2"]]
    once, one = equalize(model, regions, {}, 0.5, ranges="weights")
    _, again = equalize(once, regions, {}, 0.5, ranges="weights")
    assert one["passes"] == 1 and again["largest_log_d"][0] > 0.05  # one pass is not a fixed point
    converged, many = equalize(model, regions, {}, 0.5, ranges="weights", passes=200, tolerance=1e-3)
    assert 1 < many["passes"] < 200 and many["largest_log_d"][-1] < 1e-3
    _, after = equalize(converged, regions, {}, 0.5, ranges="weights")
    assert after["largest_log_d"][0] < 1e-3  # another pass moves nothing: the fixed point
    for x in _feeds(3):
        ((ref,), (got,)) = _outputs(model, x), _outputs(converged, x)
        assert np.abs(ref - got).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    _, measured = equalize(model, regions, _channel_max(model, ["a1", "a2"]), 0.5, passes=5)
    assert measured["passes"] == 1  # activation ranges are measured once, on the model as given


def _fpn(width_b: int = 6) -> onnx.ModelProto:
    """conv_a and conv_b (rows spread 100x) -> Resize(conv_b) -> Add -> LeakyRelu -> conv_c: an FPN's lateral
    plus the upsampled level above. ``width_b`` 1: the Add broadcasts conv_b's one channel over conv_a's six,
    which no per-channel d of both can keep exact."""
    rng = np.random.default_rng(3)
    rows = np.logspace(-1, 1, 6)

    def w(name: str, *shape: int, spread: bool = True) -> onnx.TensorProto:
        arr = rng.normal(0, 0.3, shape)
        if spread:
            arr = arr * np.resize(rows, shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
        return numpy_helper.from_array(arr.astype(np.float32), name)

    inits = [w("wa", 6, 3, 3, 3), w("ba", 6), w("wb", width_b, 3, 3, 3), w("bb", width_b),
             w("wc", 4, 6, 3, 3, spread=False), numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc")]
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "wb", "bb"], ["b"], name="conv_b", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Resize", ["b", "", "sc"], ["up"], name="up", mode="nearest"),
             helper.make_node("Add", ["a", "up"], ["sum"], name="add"),
             helper.make_node("LeakyRelu", ["sum"], ["act"], name="act", alpha=0.1),
             helper.make_node("Conv", ["act", "wc"], ["y"], name="conv_c", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "fpn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return prepare_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def test_equalisation_through_an_add_ties_both_convs_and_stays_exact() -> None:
    model = _fpn()
    alone = ["a feeds Add add", "up feeds Add add", "y is a graph output"]
    assert sorted(r.why_not or "" for r in find_regions(model)) == alone
    (region,) = [r for r in find_regions(model, through_adds=True) if r.sources != ["conv_c"]]
    assert region.why_not is None and region.ties == [["conv_a", "conv_b"]] and region.absorbers == ["conv_c"]
    eq, summary = equalize(model, [region], {}, 0.5, ranges="weights")
    assert len(summary["regions"]) == 1
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in eq.graph.initializer}
    d_a, d_b = inits["ba"] / after["ba"], inits["bb"] / after["bb"]
    assert np.allclose(d_a, d_b, rtol=1e-5) and np.ptp(np.log(d_a)) > 1.0  # one d, and not a flat one
    for x in _feeds(3):
        ((ref,), (got,)) = _outputs(model, x), _outputs(eq, x)
        assert np.abs(ref - got).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    before, flat = _channel_max(model, ["act"])["act"], _channel_max(eq, ["act"])["act"]
    assert flat.min() / flat.max() > 2 * before.min() / before.max()


def test_an_add_that_broadcasts_one_channel_is_not_tied() -> None:
    model = _fpn(width_b=1)
    assert _outputs(model, _feeds(1)[0])[0].shape == (1, 4, 16, 16)  # a valid model
    regions = find_regions(model, through_adds=True)
    assert sorted(r.why_not or "" for r in regions) == ["a feeds Add add", "up feeds Add add", "y is a graph output"]
    assert not any(r.ties for r in regions)
