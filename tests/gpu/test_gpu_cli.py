"""``edgert run --gpu-pipeline`` without what it needs: one line on stderr, exit 1, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgert.platform import gpu_present


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgert.cli.main", "run", *args], capture_output=True, text=True, timeout=120
    )


def test_bad_slots_is_one_line() -> None:
    proc = _run("--gpu-pipeline", "--slots", "0", "--model", "m.onnx", "--source", "v.avi")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "edgert: error: slots must be >= 1, got 0"


def test_bad_memory_mode_is_rejected_by_the_parser() -> None:
    proc = _run("--gpu-pipeline", "--memory", "shared", "--model", "m.onnx", "--source", "v.avi")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(gpu_present()[0], reason="this machine has a GPU: tests/gpu/test_gpu_device.py runs the pipeline")
def test_no_gpu_is_one_line(assets: Path) -> None:
    proc = _run(
        "--gpu-pipeline",
        "--model",
        str(assets / "models" / "detection" / "nanodet-m-416-coco-v8layout.onnx"),
        "--source",
        str(assets / "video" / "vtest.avi"),
        "--max-frames",
        "3",
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgert: error: ")
