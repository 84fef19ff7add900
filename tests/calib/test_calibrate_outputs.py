"""``edgert calibrate`` trusts only outputs that are byte for byte what it wrote, and writes them atomically."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edgert.atomic_file import write_atomic
from tests.helpers import run_cli

from .models import tiny_detector, write_images

pytest.importorskip("cv2")
ort = pytest.importorskip("onnxruntime")


@pytest.fixture()
def calibrated(tmp_path: Path) -> tuple[tuple[str, ...], Path]:
    folder = tmp_path / "imgs"
    write_images(folder, 3)
    model = tiny_detector(tmp_path / "det.onnx")
    out = tmp_path / "det.int8.onnx"
    args = ("calibrate", str(model), "--images", str(folder), "--num", "3", "--no-check", "--trt-version", "8.6.2",
            "-o", str(out))
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return args, out


def test_the_written_model_has_its_constants_folded(tmp_path: Path) -> None:
    # TensorRT 8.5's Q/DQ optimizer never finished on yolov3-tiny's Reciprocal of a Constant: the file calibrate
    # writes is folded, so trtexec on JetPack 5 builds it as edgert build does
    folder = tmp_path / "imgs"
    write_images(folder, 3)
    model = tiny_detector(tmp_path / "det.onnx", constant_stride=True)
    out = tmp_path / "det.int8.onnx"
    r = run_cli("calibrate", str(model), "--images", str(folder), "--num", "3", "--no-check", "-o", str(out))
    assert r.returncode == 0, r.stderr
    written = onnx.load(str(out))
    ops = {n.op_type for n in written.graph.node}
    assert "Reciprocal" not in ops and "Constant" not in ops and "QuantizeLinear" in ops
    stride = {i.name: numpy_helper.to_array(i) for i in written.graph.initializer}["stride"]
    assert float(stride) == 8.0
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert report["sha256"]["onnx"] == hashlib.sha256(out.read_bytes()).hexdigest()
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]
    assert got.shape == (1, 7, 64) and np.isfinite(got).all()


def test_report_records_the_outputs_hashes(calibrated: tuple[tuple[str, ...], Path]) -> None:
    _, out = calibrated
    report = json.loads(out.with_name("det.int8.report.json").read_text())
    assert report["sha256"]["onnx"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert report["sha256"]["cache"] == hashlib.sha256(out.with_name("det.int8.calib").read_bytes()).hexdigest()
    assert not list(out.parent.glob(".*.tmp-*"))  # no temporary file left behind


@pytest.mark.parametrize("damage", ["truncate", "cache"])
def test_damaged_output_is_rebuilt_not_up_to_date(calibrated: tuple[tuple[str, ...], Path], damage: str) -> None:
    args, out = calibrated
    if damage == "truncate":
        out.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    else:
        cache = out.with_name("det.int8.calib")
        cache.write_text(cache.read_text().replace("EntropyCalibration2", "MinMaxCalibration"))
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert "up to date" not in r.stdout and "changed since it was written" in r.stderr
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)
    assert np.isfinite(ort.InferenceSession(str(out)).run(None, {"images": x})[0]).all()  # whole again
    again = run_cli(*args)
    assert again.returncode == 0 and "up to date" in again.stdout


def test_a_report_without_hashes_is_not_trusted(calibrated: tuple[tuple[str, ...], Path]) -> None:
    args, out = calibrated
    report_path = out.with_name("det.int8.report.json")
    report = json.loads(report_path.read_text())
    del report["sha256"]
    report_path.write_text(json.dumps(report))
    assert "up to date" not in run_cli(*args).stdout


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old and whole")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_bytes(b"new but ha")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, half_then_fail)
    assert target.read_bytes() == b"old and whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
