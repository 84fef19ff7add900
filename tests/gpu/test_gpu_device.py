"""The GPU processor on a real CUDA GPU: kernels against their references, the CPU processor, the CLI.

Runs on ONNX Runtime CUDA, or on TensorRT with ``EDGERT_GPU_BACKEND=tensorrt`` (the engines each test needs
are built first by :func:`prepared`: scripts/gpu_trt85.sh tests). Skips with a reason where there is no GPU,
no pycuda or not that backend (CI). On the device (scripts/gpu_pipeline.sh) it prints the measured tensor max
abs error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgert._lazy import is_importable
from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.pipeline import Pipeline
from edgert.pipeline.gpu import GpuProcessor, GpuSlot
from edgert.vision.detections import Detections

cv2 = pytest.importorskip("cv2")


#: The GPU backend of these tests: onnxruntime-cuda, or tensorrt (EDGERT_GPU_BACKEND=tensorrt on the device).
GPU_BACKEND = os.environ.get("EDGERT_GPU_BACKEND", "onnxruntime-cuda")


def prepared(model: Path, batch: int = 1) -> Path:
    """``model`` ready to open on GPU_BACKEND for ``batch`` frames a call: on TensorRT the engine the pipeline
    looks for is built (cached by its sidecar) beside the model, or beside its dynamic-batch rewrite; on ONNX
    Runtime nothing is needed."""
    from edgert.backends import builds_engines

    if not builds_engines(GPU_BACKEND):
        return model
    from edgert.builder import parse_shapes
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.cli.build import batch_profiles, max_gpu_slots
    from edgert.onnx_file import read_onnx

    dims = read_onnx(model, weights=False).graph.input[0].type.tensor_type.shape.dim
    dynamic = bool(dims) and (bool(dims[0].dim_param) or dims[0].dim_value <= 0)
    target, shapes = batch_profiles(model, batch) if dynamic or batch > 1 else (model, [])
    build_engine(target, None, BuildOptions(backend=GPU_BACKEND, profiles=tuple(parse_shapes(shapes)),
                                            contexts=max_gpu_slots() if shapes else 1))
    return model


def _gpu_reason() -> str | None:
    from edgert.platform import gpu_present

    present, why = gpu_present()
    if not present:
        return f"no CUDA GPU here ({why})"
    if not is_importable("pycuda.driver"):
        return "pycuda is not installed (pip install 'edgert[gpu]')"
    if GPU_BACKEND != "onnxruntime-cuda":
        from edgert.backends import backend_class

        probe = backend_class(GPU_BACKEND)().probe()
        return None if probe.available else f"{GPU_BACKEND}: {probe.reason}"
    if not is_importable("onnxruntime"):
        return "onnxruntime-gpu is not installed"
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return None


_REASON = _gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]
#: Tests that open ONNX Runtime CUDA sessions (or the auto backend) themselves: skipped on another GPU_BACKEND.
ort_only = pytest.mark.skipif(GPU_BACKEND != "onnxruntime-cuda",
                              reason=f"an ONNX Runtime CUDA test (EDGERT_GPU_BACKEND={GPU_BACKEND})")

NANODET = "nanodet-m-416-coco-v8layout.onnx"
YOLOV8 = "yolov8s-fall-640.onnx"


def _model(assets: Path, name: str) -> Path:
    """A detector from the assets folder; skips (with its name) when a partial assets folder lacks it."""
    path = assets / "models" / "detection" / name
    if not path.is_file():
        pytest.skip(f"{name} is not in this assets folder ({assets})")
    return path


def _frames(assets: Path, n: int = 4) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(assets / "video" / "vtest.avi"))
    out = []
    while len(out) < n:
        ok, f = cap.read()
        if not ok:
            break
        out.append(f)
    cap.release()
    out.append(cv2.imread(str(assets / "images" / "bus.jpg")))  # portrait, larger than the input
    out.append(cv2.imread(str(assets / "images" / "opencv_hfs_000.jpg")))  # smaller: upscaled
    return out


def _processor(model: Path, **runtime: object) -> GpuProcessor:
    config = PipelineConfig(model=ModelConfig(path=str(prepared(model))),
                            runtime=RuntimeConfig(**runtime))  # type: ignore[arg-type]
    return GpuProcessor(config, GPU_BACKEND)


@pytest.mark.parametrize("model", [NANODET, YOLOV8])
def test_gpu_tensor_equals_cpu_preprocessor(assets: Path, model: str) -> None:
    from edgert.vision.gpu_preprocess import emulate_letterbox

    with _processor(_model(assets, model), slots=1) as pipe:
        worst_cpu = worst_emu = 0.0
        for img in _frames(assets):
            ref = pipe.preprocessor.allocate()
            pipe.preprocessor(img, ref)
            got, _ = pipe.preprocess_to_host(img)
            worst_cpu = max(worst_cpu, float(np.abs(got.astype(np.float64) - ref).max()))
            worst_emu = max(worst_emu, float(np.abs(got[0] - emulate_letterbox(img, pipe.plan)).max()))
    print(f"{model}: GPU tensor vs CPU Preprocessor max abs error {worst_cpu}, vs numpy emulation {worst_emu}")
    assert worst_emu == 0.0
    assert worst_cpu <= 1.0 / 255.0 + 1e-6  # documented bound; 0 expected with the same OpenCV arithmetic


def _same(a: Detections, b: Detections) -> None:
    assert len(a) == len(b)
    assert sorted(a.class_id.tolist()) == sorted(b.class_id.tolist())
    for box in a.xyxy:
        assert np.abs(b.xyxy - box).max(axis=1).min() <= 1.0


@pytest.mark.parametrize("memory", ["pinned", "zero-copy"])
def test_gpu_detections_equal_cpu_path(assets: Path, memory: str) -> None:
    from edgert.vision.detector import Detector

    model = _model(assets, NANODET)
    frames = _frames(assets, 6)
    with Detector(prepared(model), backend=GPU_BACKEND) as cpu, _processor(model, memory=memory, slots=2) as pipe:
        assert pipe.memory_mode == memory and len(pipe.slots) == 2
        for f in frames:
            _same(cpu(f), pipe.detect(f))


def _jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line whole, or this raises


@pytest.mark.parametrize("model", [NANODET, YOLOV8])
def test_gpu_and_cpu_processors_give_the_same_detections_in_order(assets: Path, tmp_path: Path, model: str) -> None:
    """One pipeline, two processors: frame by frame the same boxes (within 1 px) and classes, in frame order."""
    runs = {}
    for processing in ("cpu", "gpu"):
        out = tmp_path / f"{processing}.jsonl"
        config = PipelineConfig(
            model=ModelConfig(path=str(prepared(_model(assets, model))), backend=GPU_BACKEND),
            source=SourceConfig(uri=str(assets / "video" / "vtest.avi")),
            sinks=(f"jsonl://{out}",), runtime=RuntimeConfig(processing=processing, max_frames=120, slots=3))
        summary = Pipeline(config, handle_signals=False).run()
        assert summary["processing"] == processing and summary["frames"] == 120
        runs[processing] = _jsonl(out)
    cpu, gpu = runs["cpu"], runs["gpu"]
    assert [r["frame"] for r in gpu] == list(range(120)) == [r["frame"] for r in cpu]
    for a, b in zip(cpu, gpu):
        da, db = a["detections"], b["detections"]
        assert isinstance(da, list) and isinstance(db, list) and len(da) == len(db)
        assert sorted(d["class_id"] for d in da) == sorted(d["class_id"] for d in db)
        for d in da:
            assert min(max(abs(x - y) for x, y in zip(d["box"], e["box"])) for e in db) <= 1.0


def test_overflowing_candidate_buffer_falls_back_to_host_decoding(assets: Path) -> None:
    model = prepared(_model(assets, NANODET))
    frames = _frames(assets, 2)
    config = PipelineConfig(model=ModelConfig(path=str(model), backend=GPU_BACKEND), runtime=RuntimeConfig(slots=1))
    with GpuProcessor(config, GPU_BACKEND, candidates=1024) as big, \
            GpuProcessor(config, GPU_BACKEND, candidates=1) as small:
        for f in frames:
            a, b = big.detect(f), small.detect(f)
            assert np.array_equal(a.class_id, b.class_id)
            assert np.allclose(a.xyxy, b.xyxy, atol=1e-3)
        slot = small.slots[0]
        assert isinstance(slot, GpuSlot) and slot.filter is not None and slot.filter.overflows >= 1


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgert.cli.main", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_edgert_run_picks_gpu_processing_by_itself(assets: Path, tmp_path: Path) -> None:
    """The real CLI with a GPU backend and no processing flag: the GPU processor, per-stage GPU times."""
    out = tmp_path / "dets.jsonl"
    proc = _cli("--backend", GPU_BACKEND, "--json", "--max-frames", "30",
                "--model", str(prepared(_model(assets, NANODET))),
                "--source", str(assets / "video" / "vtest.avi"), "--sink", f"jsonl://{out}")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    summary = json.loads(stdout)
    assert summary["processing"] == "gpu" and summary["frames"] == 30 and summary["fps"] > 0
    assert set(summary["gpu_ms"]) == {"upload", "preprocess", "infer", "decode"}
    assert summary["gpu_ms"]["infer"]["p50"] > 0
    assert summary["processor"]["memory"] == "pinned"  # a discrete GPU: auto picks pinned copies
    assert summary["watts"] is not None and summary["mj_per_frame"] is not None  # NVML through the one sampler
    assert len(_jsonl(out)) == 30


def test_sigterm_during_gpu_processing_flushes_everything(assets: Path, tmp_path: Path) -> None:
    """SIGTERM: exit 0, every JSONL line whole, and the mp4 has exactly the frames the JSONL has."""
    cv2 = pytest.importorskip("cv2")
    events, video = tmp_path / "e.jsonl", tmp_path / "out.mp4"
    proc = _cli("--processing", "gpu", "--backend", GPU_BACKEND, "--json", "--loop",
                "--model", str(prepared(_model(assets, YOLOV8))),
                "--source", str(assets / "video" / "vtest.avi"), "--sink", f"jsonl://{events}", "--sink", str(video))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not events.exists() or events.stat().st_size < 200_000):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-2000:]
    summary = json.loads(stdout)
    assert summary["stopped_by"] == "SIGTERM" and summary["processing"] == "gpu"
    lines = _jsonl(events)
    cap = cv2.VideoCapture(str(video))
    written = 0
    while cap.read()[0]:
        written += 1
    cap.release()
    assert len(lines) == summary["frames"] == written > 0
    assert summary["drops"] == {}


def test_sd_notify_ready_watchdog_stopping_on_gpu_processing(assets: Path, tmp_path: Path) -> None:
    from tests.service.conftest import NotifyReceiver

    receiver = NotifyReceiver(f"@edgert-gpu-{os.getpid()}")
    try:
        env = {**os.environ, "NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": "1000000"}
        proc = _cli("--processing", "gpu", "--backend", GPU_BACKEND, "--loop",
                    "--model", str(prepared(_model(assets, NANODET))),
                    "--source", str(assets / "video" / "vtest.avi"), env=env)
        receiver.wait_for("READY", timeout=120)
        receiver.wait_for("WATCHDOG", count=4, timeout=30)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr[-2000:]
        stopping = receiver.wait_for("STOPPING", timeout=5)
        assert stopping[0][0] >= sent and "SIGTERM" in stopping[0][1].get("STATUS", "")
    finally:
        receiver.close()


def test_gpu_processing_fills_a_second_input_from_the_config(tmp_path: Path) -> None:
    """The same rule as the CPU processor: a second input is refused by name, or filled with model.inputs on
    the device (compute_only copies nothing, so the constant must be uploaded once per slot)."""
    from tests.cli.test_misuse_one_line import _gain_detector
    from tests.pipeline.media import make_video

    model = prepared(_gain_detector(tmp_path / "gain.onnx"))
    video = make_video(tmp_path / "v.avi", frames=12, size=(96, 64))
    base = ["--processing", "gpu", "--backend", GPU_BACKEND, "--model", str(model), "--source", str(video), "--json"]
    refused = _cli(*base)
    _, err = refused.communicate(timeout=300)
    assert refused.returncode == 1 and "cannot fill it" in err and "Traceback" not in err
    config = tmp_path / "gain.yaml"
    config.write_text("model:\n  inputs:\n    gain: [1.0]\n")
    proc = _cli(*base, "--config", str(config))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads(out)
    assert summary["processing"] == "gpu" and summary["frames"] == 12 and summary["detections"] == 12
