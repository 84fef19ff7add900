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


def test_dynamic_profile_engines_of_tensorrt_85_read_precision_from_the_tactic() -> None:
    """Two layers as TensorRT 8.5.3 reported them for yolov3-tiny FP16 (profile 1..32) on an H100: every format
    is "N/A due to dynamic shapes", so the tactic names say FP16."""
    na = [{"Name": "t", "Location": "Device", "Dimensions": [], "Format/Datatype": "N/A due to dynamic shapes"}]
    info = {"Layers": [
        {"Name": "/mods.2/conv/Conv + PWN(/mods.2/act/LeakyRelu)", "LayerType": "CaskConvolution", "Inputs": na,
         "Outputs": na, "TacticName": "sm80_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tile256"},
        {"Name": "/MaxPool", "LayerType": "CaskPooling", "Inputs": na, "Outputs": na,
         "TacticName": "sm50_xmma_pooling_coalescedC_NHWC_kMAX_3_False"},
        {"Name": "Reformatting CopyNode for Input Tensor 0 to /Pad", "LayerType": "Reformat", "Inputs": na,
         "Outputs": na},
        {"Name": "q", "LayerType": "CaskConvolution", "Inputs": na, "Outputs": na,
         "TacticName": "sm80_xmma_fprop_implicit_gemm_interleaved_i8i8_i8i32_f32_nchw_vect_c_32kcrs_vect_c_32"},
    ]}
    s = summarize_layers(info)
    assert s.reformats == 1 and s.by_precision == {"fp16": 1, "other": 1, "int8": 1}
    assert s.float_layers == ["/mods.2/conv/Conv + PWN(/mods.2/act/LeakyRelu)"]
