"""The layer report reads TensorRT's engine-inspector JSON: compute layers by precision, reformats, float layers.

The JSON below keeps the shape and the ``Format/Datatype`` texts of TensorRT 8.5's DETAILED output (layer names
shortened); the device's own reports are checked by tests/gpu/test_tensorrt.py.
"""

from __future__ import annotations

import json

from edgert.engine.layers import summarize_layers

INT8_CHW32 = "Thirty-two wide channel vectorized row major Int8 format"
HALF_HWC8 = "Channel major FP16 format where channel % 8 == 0"
FLOAT_LINEAR = "Row major linear FP32 format"


def _layer(name: str, kind: str, out: str) -> dict[str, object]:
    return {"Name": name, "LayerType": kind, "Inputs": [{"Name": "in", "Format/Datatype": out}],
            "Outputs": [{"Name": "out", "Format/Datatype": out}], "TacticName": "sm90_xmma"}


def test_counts_layers_by_precision_and_reformats() -> None:
    info = {"Layers": [
        _layer("conv1", "CaskConvolution", INT8_CHW32),
        _layer("conv2 + silu", "CaskConvolution", INT8_CHW32),
        _layer("Reformatting CopyNode for Input Tensor 0 to concat", "Reformat", HALF_HWC8),
        _layer("resize", "Resize", HALF_HWC8),
        _layer("head", "CaskConvolution", FLOAT_LINEAR),
    ], "Bindings": ["images", "output0"]}
    s = summarize_layers(json.dumps(info))
    assert (s.layers, s.reformats) == (5, 1)
    assert s.by_precision == {"int8": 2, "fp16": 1, "fp32": 1}
    assert s.float_layers == ["resize", "head"]
    assert s.to_json()["float_layers"] == 2 and s.detailed


def test_an_engine_without_detailed_verbosity_says_so() -> None:
    s = summarize_layers({"Layers": ["conv1", "conv2"], "Bindings": ["images"]})
    assert not s.detailed and s.layers == 2 and s.by_precision == {}
