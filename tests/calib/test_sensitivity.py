"""The mixed-precision pass on a tiny real detector."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgert.calib.accuracy import detection_map
from edgert.calib.comparison import PRED_CONF, _with_conf, detections_on
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


def test_float_layers_are_chosen_from_the_quantized_ones(tmp_path: Path) -> None:
    path = tiny_detector(tmp_path / "d.onnx", size=32)
    model = prepare_model(onnx.load(str(path)))
    plan = plan_quantization(model)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (40, 40, 3), dtype=np.uint8) for _ in range(3)]
    config = PipelineConfig()
    reference = detections_on(path, frames, config)
    # deliberately bad ranges: every activation clipped hard, so INT8 loses accuracy
    amax = {t: 0.05 for t in plan.activation_tensors}
    result = find_float_layers(model, plan, amax, frames, _with_conf(config, PRED_CONF), reference, max_drop=0.0,
                               score_frames=2, max_float=1.0)
    nodes = [t.node for t in plan.targets]
    assert set(result.scores) == set(nodes)
    assert result.float_layers and set(result.float_layers) <= set(nodes)
    assert [s["float_layers"] for s in result.steps] == _steps(len(nodes))[: len(result.steps)]
    if len(result.float_layers) == len(nodes):  # everything float: exactly FP32 again
        assert result.steps[-1]["map50_95"] == pytest.approx(detection_map(reference[0], reference[0]).map50_95)
