"""Mixed precision: find the layers INT8 hurts most and leave them in float until accuracy is back.

1. Sensitivity of each quantized layer: a model with only that layer in INT8 is run on a few frames,
   and its outputs' error against FP32 (per-feature MSE over variance,
   :func:`~edgert.calib.accuracy.normalized_error`) is the layer's score.
2. Greedy repair: the most sensitive layers go back to float in growing steps (1, 2, 4, ...) and the
   whole model is measured (detection mAP against FP32 detections) after each step, until the drop is
   within ``max_drop`` or ``max_float`` of the layers are float.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgert.calib.accuracy import detection_map, normalized_error
from edgert.calib.qdq import GraphPlan, write_qdq
from edgert.config import PipelineConfig
from edgert.vision.detections import Detections

__all__ = ["SensitivityResult", "find_float_layers"]

log = logging.getLogger(__name__)


@dataclass
class SensitivityResult:
    float_layers: list[str]  # nodes left unquantized
    scores: dict[str, float]  # node -> output error with only that node quantized
    steps: list[dict[str, Any]] = field(default_factory=list)  # {"float_layers": n, "map50_95": x}
    target_met: bool = False

    def to_dict(self) -> dict[str, Any]:
        worst = sorted(self.scores.items(), key=lambda kv: -kv[1])[:10]
        return {
            "float_layers": self.float_layers, "target_met": self.target_met, "steps": self.steps,
            "most_sensitive": [{"node": k, "error": round(v, 6)} for k, v in worst],
        }


def find_float_layers(model: onnx.ModelProto, plan: GraphPlan, amax: dict[str, float],
                      frames: Sequence[np.ndarray], config: PipelineConfig,
                      reference: tuple[list[Detections], list[dict[str, np.ndarray]]],
                      max_drop: float, score_frames: int = 4, max_float: float = 0.25,
                      progress: bool = False, log_fn: Callable[[str], None] | None = None) -> SensitivityResult:
    """Choose layers to keep in float so that mAP >= 1 - ``max_drop`` (see the module docstring)."""
    from tqdm import tqdm

    from edgert.calib.comparison import detections_on

    ref_dets, ref_outs = reference
    nodes = [t.node for t in plan.targets]
    scores: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="edgert-sens-") as tmp:
        path = Path(tmp) / "probe.onnx"
        few = list(frames[:score_frames])
        for node in tqdm(nodes, desc="sensitivity", unit="layer", disable=not progress, leave=False):
            others = [n for n in nodes if n != node]
            onnx.save(write_qdq(model, plan, amax, exclude_nodes=others), str(path))
            _, outs = detections_on(path, few, config)
            errs = [normalized_error(r[k], o[k]) for r, o in zip(ref_outs, outs) for k in r if k in o]
            scores[node] = float(np.mean(errs)) if errs else 0.0
        ranked = sorted(nodes, key=lambda n: -scores[n])
        limit = max(1, int(len(nodes) * max_float))
        result = SensitivityResult([], scores)
        step = 1
        while True:
            chosen = ranked[: min(step, limit)]
            onnx.save(write_qdq(model, plan, amax, exclude_nodes=chosen), str(path))
            dets, _ = detections_on(path, frames, config)
            value = detection_map(ref_dets, dets).map50_95
            result.steps.append({"float_layers": len(chosen), "map50_95": round(value, 5)})
            if log_fn:
                log_fn(f"sensitivity: {len(chosen)} layer(s) in float -> mAP@0.5:0.95 {value:.4f}")
            result.float_layers = chosen
            if value >= 1.0 - max_drop:
                result.target_met = True
                break
            if len(chosen) >= limit:
                break
            step *= 2
    return result
