"""Empirical bias correction on a tiny real detector: after it, the INT8 outputs' means per channel are FP32's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from edgert.calib.bias_correction import bias_corrections
from edgert.calib.collect import ActivationCollector
from edgert.calib.layer_error import twin_model
from edgert.calib.qdq import plan_quantization, prepare_model, write_qdq
from edgert.calib.sensitivity import output_layers
from edgert.errors import CalibrationError

from .models import tiny_detector

ort = pytest.importorskip("onnxruntime")


def _setup(tmp_path: Path) -> tuple[onnx.ModelProto, object, dict[str, float], list[dict[str, np.ndarray]]]:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "m.onnx", residual=True))))
    plan = plan_quantization(model)
    rng = np.random.default_rng(3)
    # inputs with a positive mean, as images are: E[x] != 0 makes rounded weights shift the output's mean
    feeds = [{"images": rng.uniform(0.0, 1.0, (1, 3, 32, 32)).astype(np.float32)} for _ in range(6)]
    collector = ActivationCollector(model, plan.activation_tensors)
    for f in feeds:
        collector.update(f["images"])
    # coarse ranges (a third of the largest value) so clipping shifts the means well beyond rounding noise
    amax = {n: h.abs_max / 3 for n, h in collector.histograms.items()}
    return model, plan, amax, feeds


def _means(model: onnx.ModelProto, tensors: list[str], feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    for t in tensors:
        m.graph.output.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = [sess.run(tensors, f) for f in feeds]
    return [np.mean([r[i] for r in runs], axis=(0, 1, 3, 4)) for i in range(len(tensors))]


def test_local_correction_makes_each_int8_conv_mean_the_fp32_mean(tmp_path: Path) -> None:
    model, plan, amax, feeds = _setup(tmp_path)
    shifts = bias_corrections(model, plan, amax, lambda: iter(feeds), "local")
    convs = [t.node for t in plan.targets if t.op_type == "Conv"]
    assert sorted(shifts) == sorted(convs) and len(convs) == 4
    for bias, expect_zero in ((None, False), (shifts, True)):
        probe, pairs = twin_model(model, plan, amax, {"bias": bias})
        for node in convs:
            ref, twin = pairs[node]
            fp32, int8 = _means(probe, [ref, twin], feeds)
            gap = np.abs(fp32 - int8).max()
            if expect_zero:
                assert gap < 1e-4 * max(1.0, float(np.abs(fp32).max())), node
            else:
                assert gap > 1e-3, node  # the clipped INT8 layer is biased before the correction


def test_output_correction_makes_the_whole_int8_model_head_mean_the_fp32_mean(tmp_path: Path) -> None:
    model, plan, amax, feeds = _setup(tmp_path)
    heads = output_layers(model, plan)
    assert heads == ["head_conv"]
    head_out = next(n.output[0] for n in model.graph.node if n.name == "head_conv")
    (fp32,) = _means(model, [head_out], feeds)
    (before,) = _means(write_qdq(model, plan, amax), [head_out], feeds)
    shifts = bias_corrections(model, plan, amax, lambda: iter(feeds), "both", heads)
    (after,) = _means(write_qdq(model, plan, amax, bias=shifts), [head_out], feeds)
    assert np.abs(fp32 - before).max() > 1e-2
    assert np.abs(fp32 - after).max() < 1e-4 * max(1.0, float(np.abs(fp32).max()))
    # a layer left float keeps its FP32 bias: the correction is only folded into quantized convs
    floated = write_qdq(model, plan, amax, exclude_nodes=["head_conv"], bias=shifts)
    head = next(n for n in floated.graph.node if n.name == "head_conv")
    assert head.input[2] == "bh"


def test_unknown_mode_is_one_line(tmp_path: Path) -> None:
    model, plan, amax, feeds = _setup(tmp_path)
    with pytest.raises(CalibrationError, match="unknown bias correction"):
        bias_corrections(model, plan, amax, lambda: iter(feeds), "sideways")
