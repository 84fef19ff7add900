"""Weight rounding by output error on a tiny real detector: never worse than nearest, better on random convs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgert.calib.qdq import quantize_weight
from edgert.calib.rounding import gptq_round, output_error, weight_roundings

from .models import check_roundings_carried, planned_on_random_feeds

pytest.importorskip("onnxruntime")


def test_gptq_rounding_lowers_the_output_error_of_a_random_layer() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    x = rng.standard_normal((4000, 72)) @ rng.standard_normal((72, 72))  # correlated inputs, as images give
    h = x.T @ x / len(x)
    near, scale = quantize_weight(w, 0)
    chosen = gptq_round(w, h)
    assert chosen.dtype == np.int8 and chosen.shape == w.shape and np.abs(chosen.astype(int)).max() <= 127
    s = scale.reshape(-1, 1, 1, 1)
    e_near = output_error(w, near * s, h)
    e_new = output_error(w, chosen * s, h)
    assert e_new < 0.8 * e_near
    # H = I: the output error is the weight error, which nearest rounding already minimises
    assert output_error(w, gptq_round(w, np.eye(72)) * s, np.eye(72)) == pytest.approx(e := output_error(
        w, near * s, np.eye(72)), rel=1e-6) and e > 0


def test_weight_roundings_on_a_model_keep_the_scales_and_lower_each_layer_error(tmp_path: Path) -> None:
    model, plan, feeds, amax = planned_on_random_feeds(tmp_path)
    rounded, errors = weight_roundings(model, plan, amax, iter(feeds), per_image=64)
    check_roundings_carried(model, plan, amax, rounded, errors)
