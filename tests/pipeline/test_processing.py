"""Choosing the processor: ``runtime.processing`` / ``--processing``, what auto picks, what is refused.

Through the real CLI in subprocesses: every refusal is one line on stderr, exit 1 (2 for argparse), no
traceback. On this machine (no GPU) ``auto`` must pick the CPU processor and GPU-only keys must be refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig
from edgert.errors import ConfigError
from edgert.pipeline.choice import resolve_processing
from edgert.platform import gpu_present
from tests.pipeline.media import make_video, tiny_detector

pytest.importorskip("onnxruntime")
pytest.importorskip("cv2")

NO_GPU = pytest.mark.skipif(gpu_present()[0], reason="this machine has a GPU: tests/gpu runs the GPU processor")


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgert.cli.main", "run", *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("edgert: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("processing")
    return {"video": make_video(root / "v.avi", frames=12, size=(96, 64)), "model": tiny_detector(root / "t.onnx")}


def test_bad_slots_is_one_line() -> None:
    line = _one_line(_run("--processing", "gpu", "--slots", "0", "--model", "m.onnx", "--source", "v.avi"))
    assert line == "edgert: error: --slots: expected 1..16, got 0"


def test_bad_processing_and_memory_are_rejected_by_the_parser() -> None:
    for flags in (["--memory", "shared"], ["--processing", "tpu"]):
        proc = _run(*flags, "--model", "m.onnx", "--source", "v.avi")
        assert proc.returncode == 2 and "invalid choice" in proc.stderr and "Traceback" not in proc.stderr


def test_gpu_pipeline_alias_contradicting_processing_is_refused() -> None:
    line = _one_line(_run("--gpu-pipeline", "--processing", "cpu", "--model", "m.onnx", "--source", "v.avi"))
    assert "--gpu-pipeline means --processing gpu" in line


@NO_GPU
def test_auto_picks_the_cpu_processor_here(media: dict[str, Path]) -> None:
    proc = _run("--model", str(media["model"]), "--source", str(media["video"]), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["processing"] == "cpu" and summary["processor"]["kind"] == "cpu"
    assert summary["frames"] == 12 and summary["slots"] == summary["processor"]["slots"] >= 1


@NO_GPU
@pytest.mark.parametrize("flags", [["--processing", "gpu"], ["--gpu-pipeline"]])
def test_gpu_processing_without_a_gpu_is_one_line_saying_why(media: dict[str, Path], flags: list[str]) -> None:
    line = _one_line(_run(*flags, "--model", str(media["model"]), "--source", str(media["video"])))
    assert "runtime.processing: gpu: no usable GPU" in line


@NO_GPU
def test_gpu_processing_in_yaml_without_a_gpu(media: dict[str, Path], tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsource: {{uri: {media['video']}}}\n"
                   "runtime:\n  processing: gpu\n  slots: 2\n")
    line = _one_line(_run("--config", str(cfg)))
    assert "runtime.processing: gpu: no usable GPU" in line


def test_processing_typo_in_yaml_names_file_and_line(media: dict[str, Path], tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nruntime:\n  processing: gpuu\n")
    line = _one_line(_run("--config", str(cfg), "--source", str(media["video"])))
    assert f"{cfg}:3: runtime.processing: expected one of auto, cpu, gpu" in line


@NO_GPU
@pytest.mark.parametrize("flags,key", [(["--memory", "pinned"], "runtime.memory (--memory)"),
                                       (["--cuda-graph"], "runtime.cuda_graph (--cuda-graph)"),
                                       (["--fixed-batch"], "runtime.part_batches (--fixed-batch)")])
def test_gpu_only_flags_are_refused_on_the_cpu_processor(media: dict[str, Path], flags: list[str], key: str) -> None:
    line = _one_line(_run(*flags, "--model", str(media["model"]), "--source", str(media["video"])))
    assert key in line and "applies to GPU processing only" in line


@pytest.mark.parametrize("backend", ["tensorrt", "tensorrt-rtx"])
def test_a_cuda_graph_on_a_backend_that_captures_none_is_refused(media: dict[str, Path], backend: str) -> None:
    """TensorRT sessions enqueue each call: --cuda-graph there is refused in one line, on any machine, rather than
    run without a graph."""
    line = _one_line(_run("--cuda-graph", "--backend", backend, "--model", str(media["model"]),
                          "--source", str(media["video"])))
    assert f"the {backend} backend does not capture CUDA graphs" in line and "--backend onnxruntime-cuda" in line


def test_resolve_processing_cpu_backend(media: dict[str, Path]) -> None:
    model = ModelConfig(path=str(media["model"]), backend="onnxruntime")
    assert resolve_processing(PipelineConfig(model=model))[:2] == ("onnxruntime", "cpu")
    with pytest.raises(ConfigError, match="backend onnxruntime runs on the CPU"):
        resolve_processing(PipelineConfig(model=model, runtime=RuntimeConfig(processing="gpu")))
    with pytest.raises(ConfigError, match=r"runtime\.memory"):
        resolve_processing(PipelineConfig(model=model, runtime=RuntimeConfig(processing="cpu", memory="pinned")))


@pytest.mark.parametrize("text,watts", [("10", 10.0), ("10W", 10.0), ("7.5w", 7.5), (" 12 W", 12.0)])
def test_power_budget_accepts_watts_with_or_without_unit(text: str, watts: float) -> None:
    from edgert.cli.run import parse_watts

    assert parse_watts(text) == watts


def test_power_budget_bad_value_is_a_usage_error() -> None:
    proc = _run("--power-budget", "ten", "--model", "m.onnx", "--source", "v.avi")
    assert proc.returncode == 2 and "expected watts such as 10 or 10W" in proc.stderr
