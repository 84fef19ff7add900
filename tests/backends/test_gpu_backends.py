"""GPU backends: on a CPU-only machine their probes say why they cannot run; on a GPU machine (with pycuda
and onnxruntime-gpu) the ONNX Runtime CUDA session and the CUDA helpers run for real."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from edgert.backends import _load, get_backend
from edgert.errors import BackendUnavailable
from tests.helpers import scale_model

ORT_CUDA = _load("onnxruntime-cuda")
gpu = pytest.mark.skipif(not ORT_CUDA.probe().available, reason=f"no CUDA here: {ORT_CUDA.probe().reason}")


@pytest.mark.parametrize("name", ["onnxruntime-cuda", "tensorrt", "tensorrt-rtx"])
def test_probe_never_raises_and_says_why(name: str) -> None:
    probe = _load(name).probe()
    assert probe.name == name
    if not probe.available:
        assert probe.reason  # one line naming what is missing
        with pytest.raises(BackendUnavailable, match=f"backend {name} cannot run here"):
            get_backend(name)


def test_tensorrt_stub_package_counts_as_missing() -> None:
    # tensorrt-stubs installs a bare tensorrt/ folder of .pyi files: that is not TensorRT.
    probe = _load("tensorrt").probe()
    try:
        import tensorrt

        real = getattr(tensorrt, "__file__", None) is not None
    except ImportError:
        real = False
    if not real:
        assert not probe.available and "tensorrt" in probe.reason


@gpu
def test_cuda_helpers_round_trip_on_two_threads() -> None:
    from edgert.backends.cuda import CudaDevice

    dev = CudaDevice.get(0)
    errors: list[str] = []

    def work(seed: int) -> None:
        with dev.active():
            host = dev.pinned_empty((256, 256), np.float32)
            back = dev.pinned_empty((256, 256), np.float32)
            host[...] = np.random.default_rng(seed).random(host.shape, dtype=np.float32)
            buf, s = dev.alloc(host.nbytes), dev.stream()
            e0, e1 = dev.event(), dev.event()
            e0.record(s)
            buf.copy_from_host_async(host, s)
            buf.copy_to_host_async(back, s)
            e1.record(s)
            s.synchronize()
            if not np.array_equal(host, back) or e1.elapsed_ms(e0) < 0:
                errors.append(f"thread {seed}")
            buf.free()
            del host, back, s, e0, e1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@gpu
def test_ort_cuda_session_matches_cpu_with_pinned_buffers(tmp_path: Path) -> None:
    from edgert.backends import open_session

    model = scale_model(tmp_path / "s.onnx", shape=(2, 8), factor=3.0)
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    with open_session(model, "onnxruntime-cuda") as session:
        assert type(session.inputs["x"].base).__name__ == "PagelockedHostAllocation"
        out = session.infer({"x": x})
        assert out is session.outputs
        np.testing.assert_allclose(out["y"], x * 3.0)
        session.timing = True
        session.infer({"x": x + 1})
        assert session.last_timing is not None and set(session.last_timing) == {"h2d_ms", "compute_ms", "d2h_ms"}
        np.testing.assert_allclose(session.outputs["y"], (x + 1) * 3.0)
        session.compute_only()
