"""``edgert bench`` through the real CLI, on the CPU backend (GPU figures: scripts/gpu_check.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, run_cli, tiny_model

pytest.importorskip("onnxruntime")


def test_bench_json_has_latency_percentiles_and_throughput(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "t.onnx", shape=("batch", 3, 8, 8))
    res = run_cli("bench", str(model), "--backend", "onnxruntime", "--iterations", "25", "--warmup", "2",
                  "--shapes", "x:2x3x8x8", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["backend"] == "onnxruntime" and data["iterations"] == 25
    assert data["inputs"] == {"x": [2, 3, 8, 8]}
    lat = data["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert data["throughput_fps"] > 0 and "gpu" not in data


def test_bench_text_duration_and_power_without_a_meter(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "t.onnx")
    res = run_cli("bench", str(model), "--backend", "onnxruntime", "--duration", "0.2", "--warmup", "1", "--power")
    assert res.returncode == 0, res.stderr
    assert "latency ms   p50" in res.stdout and "throughput" in res.stdout
    power = [ln for ln in res.stdout.splitlines() if ln.startswith("power")]
    assert len(power) == 1  # watts, or one line saying why there are none


def test_bench_errors_are_one_line(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "t.onnx")
    assert_one_line_error(run_cli("bench", str(model), "--backend", "onnxruntime", "--iterations", "0"),
                          "--iterations")
    assert_one_line_error(run_cli("bench", str(model), "--backend", "onnxruntime", "--precisions", "fp32,fp16"),
                          "--precisions compares TensorRT engine precisions")
    assert_one_line_error(run_cli("bench", str(tmp_path / "missing.onnx"), "--backend", "onnxruntime"),
                          "not found")
    assert_one_line_error(run_cli("bench", str(model), "--backend", "nope"), "unknown backend 'nope'")


def test_build_and_bench_help_work_without_optional_packages() -> None:
    for cmd in ("build", "bench"):
        res = run_cli(cmd, "--help")
        assert res.returncode == 0 and "usage: edgert " + cmd in res.stdout
