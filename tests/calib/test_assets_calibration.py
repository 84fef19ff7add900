"""Calibration of a real detector from the assets: Q/DQ runs in ONNX Runtime, the cache is valid,
INT8 still finds what FP32 finds, and TensorRT-RTX (when installed) parses and builds the Q/DQ model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgert.calib.calibrate import CalibrationOptions, calibrate
from edgert.calib.trt_cache import read_cache

pytest.importorskip("onnxruntime")
pytest.importorskip("cv2")

pytestmark = pytest.mark.assets


@pytest.fixture(scope="module")
def nanodet_int8(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("calib") / "nanodet.int8.onnx"
    model = assets / "models/detection/nanodet-m-416-coco-v8layout.onnx"
    options = CalibrationOptions(num=8, check_frames=4, trt_version="8.6.2", max_drop=None)  # full INT8
    report = calibrate(model, assets / "images", out, options=options, progress=False)
    return {"model": model, "out": out, "report": report}


def test_nanodet_qdq_detects_like_fp32(nanodet_int8: dict[str, Any], assets: Path) -> None:
    import cv2

    from edgert.vision.detector import Detector

    report = nanodet_int8["report"]
    assert report["images"]["used"] == 8
    assert report["summary"]["quantized_layers"] >= 30
    assert report["summary"]["nonfinite_tensors"] == ["PartitionedCall/PadV2:0"]  # the -inf padding
    assert report["accuracy"]["map"]["map50"] > 0.5  # 4 held-out photos, 8 calibration images
    frame = cv2.imread(str(assets / "images/bus.jpg"))
    with Detector(nanodet_int8["out"], backend="onnxruntime") as det:
        found = det(frame).class_names()
    assert "bus" in found and "person" in found


def test_nanodet_cache_lists_finite_activations_only(nanodet_int8: dict[str, Any]) -> None:
    version, algorithm, scales = read_cache(Path(nanodet_int8["report"]["files"]["cache"]))
    assert (version, algorithm) == (8602, "EntropyCalibration2")
    assert len(scales) > 100
    assert "PartitionedCall/PadV2:0" not in scales and "output0" not in scales and "pp_cls" not in scales
    assert all(0 < s < 1 for s in scales.values())


def test_tensorrt_rtx_parses_and_builds_the_qdq_model(nanodet_int8: dict[str, Any]) -> None:
    trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX not installed (pip install 'edgert[rtx]')")
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(nanodet_int8["out"]))
    assert ok, [str(parser.get_error(i)) for i in range(parser.num_errors)]
    engine = builder.build_serialized_network(network, builder.create_builder_config())
    assert engine is not None and engine.nbytes > 0
