"""What a built engine does per layer, from TensorRT's engine inspector (an engine built with
``ProfilingVerbosity.DETAILED``: ``edgert build --detailed-layers``): how many layers compute in INT8, FP16 and
FP32, and how many are reformats that only convert between precisions or layouts. An INT8 engine is faster than
its FP16 one only where most work stays INT8 and few reformats sit at the edges of float islands, so these counts
say why an engine is as fast as it is.

Pure: it reads the inspector's JSON (a string or the parsed dict), so it runs without TensorRT.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LayerSummary", "summarize_layers"]


def _precision(fmt: str) -> str:
    """``Format/Datatype`` text of a tensor (``"Thirty-two wide channel vectorized row major Int8 format"``)."""
    text = fmt.lower()
    for key, name in (("int8", "int8"), ("fp16", "fp16"), ("half", "fp16"), ("fp32", "fp32"), ("float", "fp32"),
                      ("int32", "int32"), ("bool", "bool")):
        if key in text:
            return name
    return "other"


#: Kernel-name tokens of TensorRT's convolution and matrix tactics (``sm80_xmma_fprop_implicit_gemm_f16f16_...``,
#: ``..._i8i8_i8i32_f32_...``, ``..._tf32f32_...``): what a layer computes in when the formats are not in the report.
_TACTIC_TOKENS = (("i8i8", "int8"), ("int8", "int8"), ("f16f16", "fp16"), ("h884", "fp16"), ("h1688", "fp16"),
                  ("hmma", "fp16"), ("tf32", "fp32"), ("f32f32", "fp32"), ("scudnn", "fp32"), ("sgemm", "fp32"))


def _tactic_precision(tactic: str) -> str:
    text = tactic.lower()
    for token, name in _TACTIC_TOKENS:
        if token in text:
            return name
    return "other"


@dataclass(frozen=True)
class LayerSummary:
    layers: int
    reformats: int  # layers that only change precision or layout
    by_precision: dict[str, int]  # compute layers (reformats excluded) by the precision of their first output
    float_layers: list[str] = field(default_factory=list)  # names of compute layers whose output is FP16/FP32
    detailed: bool = True  # False: the engine was built without DETAILED verbosity (names only, no precision)

    def to_json(self) -> dict[str, Any]:
        return {"layers": self.layers, "reformats": self.reformats, "by_precision": dict(self.by_precision),
                "float_layers": len(self.float_layers), "float_layer_names": list(self.float_layers),
                "detailed": self.detailed}


def summarize_layers(info: str | dict[str, Any]) -> LayerSummary:
    data = json.loads(info) if isinstance(info, str) else info
    layers = data.get("Layers", [])
    if layers and not isinstance(layers[0], dict):  # names only: built without DETAILED verbosity
        return LayerSummary(len(layers), 0, {}, [], detailed=False)
    reformats = 0
    counts: Counter[str] = Counter()
    floats: list[str] = []
    for layer in layers:
        kind = str(layer.get("LayerType", ""))
        if kind == "Reformat":
            reformats += 1
            continue
        outputs = layer.get("Outputs") or []
        precision = _precision(str(outputs[0].get("Format/Datatype", ""))) if outputs else "other"
        if precision == "other":
            # TensorRT 8.5 reports "N/A due to dynamic shapes" as the format of every tensor of an engine with
            # a dynamic profile; the tactic name still says what the heavy layers (convolutions) compute in.
            precision = _tactic_precision(str(layer.get("TacticName", "")))
        counts[precision] += 1
        if precision in ("fp16", "fp32") and not kind.startswith(("Constant", "NoOp")):
            floats.append(str(layer.get("Name", "")))
    return LayerSummary(len(layers), reformats, dict(counts), floats)
