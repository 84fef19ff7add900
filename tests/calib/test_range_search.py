"""Ranges chosen by the consuming layer's output error (calib.range_search) on a tiny real detector."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgert.calib.collect import ActivationCollector
from edgert.calib.layer_error import layer_errors
from edgert.calib.qdq import plan_quantization, prepare_model
from edgert.calib.range_search import candidate_ranges, search_ranges

from .models import tiny_detector

pytest.importorskip("onnxruntime")


def test_each_range_is_the_candidate_with_the_least_output_error_of_its_layer(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "d.onnx", size=32, residual=True))))
    plan = plan_quantization(model)
    rng = np.random.default_rng(0)
    # inputs with rare large values, so that the candidates differ (a clipped range against the maximum)
    inputs = [(rng.standard_normal((1, 3, 32, 32)) * rng.choice([1.0, 8.0], (1, 3, 32, 32), p=[0.999, 0.001]))
              .astype(np.float32) for _ in range(4)]
    tensors = [t for t in plan.activation_tensors if t not in plan.tail_tensors]
    collector = ActivationCollector(model, tensors)
    buffer = np.zeros((1, 3, 32, 32), np.float32)

    def fill(x: object, buf: np.ndarray) -> None:
        buf[...] = x  # type: ignore[assignment]

    hists = collector.run(inputs, fill, buffer, progress=False, total=len(inputs))
    collector.close()
    amax = {n: h.amax("percentile", 99.999) for n, h in hists.items()}
    feeds = [{"images": x} for x in inputs]
    chosen, info = search_ranges(model, plan, amax, hists, feeds)
    assert info and set(info) <= set(plan.quantized_tensors)
    assert set(chosen) == set(amax)
    for tensor, row in info.items():
        assert row["candidates"][0] == pytest.approx(amax[tensor], rel=1e-5)  # the method's range is a candidate
        assert len(row["candidates"]) == len(candidate_ranges(hists[tensor], amax[tensor]))
        assert chosen[tensor] == pytest.approx(row["chosen"], rel=1e-5)
        assert row["nsr"][row["candidates"].index(row["chosen"])] == min(row["nsr"])
    # cross-check with layer_error (another probe): for a layer with one quantized input read by it alone,
    # its own error at the chosen range is the least of its errors at the candidate ranges
    checked = 0
    for target in plan.targets:
        if len(target.activations) != 1 or target.activations[0] not in info:
            continue
        tensor = target.activations[0]
        if sum(tensor in t.activations for t in plan.targets) != 1:
            continue
        errors = [layer_errors(model, plan, {**amax, tensor: c}, feeds)[target.node]
                  for c in candidate_ranges(hists[tensor], amax[tensor])]
        picked = layer_errors(model, plan, {**amax, tensor: chosen[tensor]}, feeds)[target.node]
        assert picked == pytest.approx(min(errors), rel=1e-4)
        checked += 1
    assert checked >= 2
