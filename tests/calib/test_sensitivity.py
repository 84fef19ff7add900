"""The mixed-precision pass on a tiny real detector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edgert.calib.accuracy import detection_map
from edgert.calib.comparison import compare_detectors, detections_on
from edgert.calib.macs import count_macs
from edgert.calib.qdq import plan_quantization, prepare_model
from edgert.calib.sensitivity import _steps, find_float_layers, localization_error
from edgert.config import PipelineConfig
from edgert.vision.detections import Detections

from .models import tiny_detector

pytest.importorskip("onnxruntime")
pytest.importorskip("cv2")


def test_steps_grow_and_end_at_the_limit() -> None:
    assert _steps(1) == [1]
    steps = _steps(20)
    assert steps[:4] == [1, 2, 3, 4] and steps[-1] == 20 and steps == sorted(set(steps))


def test_localization_error() -> None:
    ref = [Detections(np.array([[0, 0, 10, 10]], np.float32), np.array([0.9]), np.array([0]))]
    assert localization_error(ref, ref) == 0.0
    shifted = [Detections(np.array([[0, 0, 10, 8]], np.float32), np.array([0.8]), np.array([0]))]
    assert localization_error(ref, shifted) == pytest.approx(1 - 0.8 + 0.1)
    assert localization_error(ref, [Detections.empty()]) == 2.0
    assert localization_error([Detections.empty()], ref) is None


def _badly_ranged(tmp_path: Path, residual: bool = False) -> tuple[Any, ...]:
    """A tiny detector, its plan, deliberately bad ranges (every activation clipped hard, so INT8 loses
    accuracy), layer feeds, MACs, and ``evaluate`` against its FP32 detections on three frames."""
    path = tiny_detector(tmp_path / "d.onnx", size=32, residual=residual)
    model = prepare_model(onnx.load(str(path)))
    plan = plan_quantization(model)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (40, 40, 3), dtype=np.uint8) for _ in range(3)]
    config = PipelineConfig()
    reference = detections_on(path, frames, config)
    amax = {t: 0.05 for t in plan.activation_tensors}
    feeds = [{"images": rng.uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)} for _ in range(2)]

    def evaluate(candidate: Path) -> dict[str, object]:
        return compare_detectors(path, candidate, ((str(i), f) for i, f in enumerate(frames)), config,
                                 reference_results=reference)

    return model, plan, amax, feeds, count_macs(model).layers, evaluate, reference


def test_float_layers_are_chosen_from_the_quantized_ones_within_the_budget(tmp_path: Path) -> None:
    model, plan, amax, feeds, macs, evaluate, reference = _badly_ranged(tmp_path)
    result = find_float_layers(model, plan, amax, evaluate, max_drop=0.0, feeds=feeds, macs=macs, max_float=1.0)
    nodes = [t.node for t in plan.targets]
    assert set(result.scores) == set(nodes)
    assert result.float_layers and set(result.float_layers) <= set(nodes)
    assert set(result.reasons) == set(result.float_layers)
    assert result.accuracy is not None and "map_strict" in result.accuracy
    first = result.steps[0]
    assert first["float_layers"] == len([n for n in nodes if result.scores[n] > 0])  # the whole budget first
    if result.target_met:  # then bisected down: every later step is shorter
        assert all(s["float_layers"] < first["float_layers"] for s in result.steps[1:])
    else:
        assert len(result.steps) == 1
    if len(result.float_layers) == len(nodes):  # everything float: exactly FP32 again
        assert result.steps[0]["map50_95"] == pytest.approx(detection_map(reference[0], reference[0]).map50_95)

    # a budget of nothing keeps nothing float and measures nothing
    none = find_float_layers(model, plan, amax, evaluate, max_drop=0.0, feeds=feeds, macs=macs, max_float=0.0)
    assert none.float_layers == [] and none.steps == [] and not none.target_met


def test_a_residual_add_is_never_returned_to_float(tmp_path: Path) -> None:
    """TensorRT fuses a residual Add into the Conv before it; kept float, that Conv's output is float too. The
    Add's own error is measured, but it is not a candidate, even with a budget for everything."""
    model, plan, amax, feeds, macs, evaluate, _ = _badly_ranged(tmp_path, residual=True)
    assert "residual_add" in {t.node for t in plan.targets}
    result = find_float_layers(model, plan, amax, evaluate, max_drop=0.0, feeds=feeds, macs=macs, max_float=1.0)
    assert "residual_add" in result.scores and result.float_layers
    assert "residual_add" not in result.float_layers


def test_full_int8_is_measured_only_after_the_budget_meets_the_target_and_kept_when_it_meets_it_too(
        tmp_path: Path) -> None:
    path = tiny_detector(tmp_path / "d.onnx", size=32)
    model = prepare_model(onnx.load(str(path)))
    plan = plan_quantization(model)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (40, 40, 3), dtype=np.uint8) for _ in range(3)]
    config = PipelineConfig()
    reference = detections_on(path, frames, config)
    amax = {t: 0.05 for t in plan.activation_tensors}
    feeds = [{"images": rng.uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)} for _ in range(2)]
    macs = count_macs(model).layers
    measured: list[Path] = []

    def evaluate(p: Path) -> dict[str, object]:
        measured.append(p)
        return compare_detectors(path, p, ((str(i), f) for i, f in enumerate(frames)), config,
                                 reference_results=reference)

    # any accuracy meets a target of 0: the budget's layers meet it, then full INT8 is measured and meets it too
    easy = find_float_layers(model, plan, amax, evaluate, max_drop=1.0, feeds=feeds, macs=macs, max_float=1.0,
                             full_int8_measured=False)
    assert easy.target_met and easy.float_layers == [] and easy.reasons == {}
    assert [s["float_layers"] for s in easy.steps] == [len([v for v in easy.scores.values() if v > 0]), 0]
    assert len(measured) == 2
    assert easy.accuracy is not None and easy.accuracy["map"]["map50_95"] == easy.steps[1]["map50_95"]
    # mAP above 1 is never met: the budget is measured once and full INT8 not at all
    measured.clear()
    hard = find_float_layers(model, plan, amax, evaluate, max_drop=-0.5, feeds=feeds, macs=macs, max_float=1.0,
                             full_int8_measured=False)
    assert not hard.target_met and len(hard.steps) == 1 and len(measured) == 1
    assert hard.float_layers and hard.steps[0]["float_layers"] == len(hard.float_layers)
