"""Kernel launches on a real CUDA GPU: the driver-API launch (``cuLaunchKernel`` through ctypes, the default)
and pycuda's prepared call write the same results, for arguments of mixed sizes and alignments."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgert._lazy import is_importable

pytestmark = [pytest.mark.gpu]

_SOURCE = r"""
extern "C" __global__ void probe(int a, unsigned long long out, float b, long long c, double d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double* o = reinterpret_cast<double*>(out);
    o[4 * i + 0] = a + i;
    o[4 * i + 1] = b;
    o[4 * i + 2] = (double)c;
    o[4 * i + 3] = d;
}
"""


@pytest.fixture(scope="module")
def device():  # type: ignore[no-untyped-def]
    from edgert.platform import gpu_present

    present, why = gpu_present()
    if not present or not is_importable("pycuda.driver"):
        pytest.skip(f"no CUDA GPU with pycuda here ({why})")
    from edgert.backends.cuda import CudaDevice

    return CudaDevice.get(0)


def _run(device, kernel, a: int, c: int, n: int = 40):  # type: ignore[no-untyped-def]
    with device.active():
        out = device.pinned_empty((n, 4), np.float64)
        out[:] = -1
        buf = device.alloc(out.nbytes)
        stream = device.stream()
        kernel.launch(((n + 31) // 32, 1, 1), (32, 1, 1),
                      (np.int32(a), np.uintp(buf.ptr), np.float32(2.5), np.int64(c), np.float64(-0.125), np.int32(n)),
                      stream)
        buf.copy_to_host_async(out, stream)
        stream.synchronize()
        buf.free()
    return out


def test_direct_launch_and_pycuda_launch_write_the_same(device) -> None:  # type: ignore[no-untyped-def]
    from edgert.backends.cuda import Kernel, compile_kernels

    with device.active():
        kernel = compile_kernels(_SOURCE, ("probe",))["probe"]
    assert kernel.handle is not None, "the driver API's launch was not set up (ctypes could not load libcuda)"
    direct = _run(device, kernel, 7, -(2**40) - 3)
    plain = _run(device, Kernel(kernel.raw, "probe"), 7, -(2**40) - 3)
    expected = np.stack([7 + np.arange(40), np.full(40, 2.5), np.full(40, -(2**40) - 3.0), np.full(40, -0.125)], 1)
    np.testing.assert_array_equal(direct, expected)
    np.testing.assert_array_equal(plain, expected)


def test_direct_launch_from_several_threads_keeps_each_threads_arguments(device) -> None:  # type: ignore[no-untyped-def]
    from edgert.backends.cuda import compile_kernels

    with device.active():
        kernel = compile_kernels(_SOURCE, ("probe",))["probe"]
    results: dict[int, np.ndarray] = {}

    def work(k: int) -> None:
        for _ in range(50):
            results[k] = _run(device, kernel, 1000 * k, k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        assert results[k][:, 0].tolist() == [1000 * k + i for i in range(40)]
        assert results[k][:, 2].tolist() == [float(k)] * 40
