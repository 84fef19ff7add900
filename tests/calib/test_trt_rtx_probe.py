"""scripts/trt_rtx_runtime_probe.py runs to the end anywhere: latency where the runtime runs, the refusal where not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .models import tiny_detector

ROOT = Path(__file__).resolve().parents[2]


def test_probe_builds_and_records_latency_or_the_exact_refusal(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    model = tiny_detector(tmp_path / "tiny.onnx", size=32)
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/trt_rtx_runtime_probe.py"), "--fp32", str(model),
                           "--work", str(tmp_path / "w"), "--out", str(out), "--warmup", "1", "--iters", "3"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert set(result["engines"]) == {"fp32", "fp16"}
    for entry in result["engines"].values():
        assert entry["build"]["step"] == "built" and entry["engine_mb"] > 0
        run = entry["run"]
        if run["step"] == "ran":
            assert run["latency_ms"]["median"] > 0
        else:  # refused: at which step, and why, in TensorRT-RTX's words where it gave any
            assert run.get("error")
    assert "wrote" in proc.stdout


def test_probe_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/trt_rtx_runtime_probe.py"), "--engine", "nonsense",
                           "--out", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "NAME=PATH" in proc.stderr and "Traceback" not in proc.stderr


def test_calibrate_reports_the_tensorrt_rtx_engine_size(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    pytest.importorskip("cv2")
    from edgert.calib.calibrate import CalibrationOptions, calibrate

    from .models import write_images

    write_images(tmp_path / "imgs", 2)
    report = calibrate(tiny_detector(tmp_path / "d.onnx"), tmp_path / "imgs", tmp_path / "d.int8.onnx",
                       options=CalibrationOptions(num=2, check=False, engine_size=True), progress=False)
    assert report["engine"]["built"] is True and report["engine"]["engine_mb"] > 0
    assert "TensorRT-RTX" in report["table"]
