"""CUDA memory, streams and events for every GPU backend: the only module that imports pycuda.

One CUDA context per device: the device's *primary* context, retained once and pushed on whichever
thread is about to touch CUDA, popped afterwards. TensorRT and ONNX Runtime (through the CUDA runtime
API) use that same primary context, so device pointers from here are valid in both, and a pipeline
thread never finds another thread's context on its stack ("invalid resource handle", "context stack
not empty" at exit).

Usage::

    dev = CudaDevice.get(0)
    with dev.active():                      # push on this thread ... pop
        host = dev.pinned_empty((1, 3, 640, 640), np.float32)
        buf = dev.alloc(host.nbytes)
        stream = dev.stream()
        buf.copy_from_host_async(host, stream)
        stream.synchronize()

Everything allocated here is freed by ``close()`` (or garbage collection) with the context pushed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from edgert._lazy import lazy_import
from edgert.errors import BackendError, BackendUnavailable

__all__ = ["CudaDevice", "DeviceBuffer", "Event", "Stream", "device_identity", "pycuda_driver"]

log = logging.getLogger(__name__)


def pycuda_driver() -> Any:
    """``pycuda.driver``, initialised once; BackendUnavailable when pycuda or the driver is missing."""
    drv = lazy_import("pycuda.driver", "CUDA buffers for GPU backends")
    try:
        drv.init()
    except Exception as exc:  # pycuda.driver.RuntimeError / LogicError: no driver, no device
        raise BackendUnavailable(f"CUDA cannot start: {exc}") from exc
    return drv


def device_identity(ordinal: int = 0) -> tuple[str, str, str]:
    """(name, compute capability "8.7", CUDA driver version "12.6") of a device, without a context."""
    drv = pycuda_driver()
    dev = drv.Device(ordinal)
    major, minor = dev.compute_capability()
    v = int(drv.get_driver_version())
    return str(dev.name()), f"{major}.{minor}", f"{v // 1000}.{(v % 1000) // 10}"


class Stream:
    """A CUDA stream; ``handle`` is the ``cudaStream_t`` value TensorRT and ONNX Runtime take."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    @property
    def handle(self) -> int:
        return int(self.raw.handle)

    def synchronize(self) -> None:
        self.raw.synchronize()


class Event:
    """A CUDA event for timing work on a stream (``elapsed_ms`` between two recorded events)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def record(self, stream: Stream) -> None:
        self.raw.record(stream.raw)

    def synchronize(self) -> None:
        self.raw.synchronize()

    def elapsed_ms(self, start: Event) -> float:
        """Milliseconds from ``start`` to this event; both must have completed."""
        return float(start.raw.time_till(self.raw))


class DeviceBuffer:
    """``nbytes`` of device memory; ``ptr`` is the address to bind (TensorRT, IOBinding)."""

    def __init__(self, raw: Any, nbytes: int) -> None:
        self.raw = raw
        self.nbytes = nbytes

    @property
    def ptr(self) -> int:
        return int(self.raw)

    def copy_from_host_async(self, host: np.ndarray, stream: Stream) -> None:
        _driver().memcpy_htod_async(self.raw, host, stream.raw)

    def copy_to_host_async(self, host: np.ndarray, stream: Stream) -> None:
        _driver().memcpy_dtoh_async(host, self.raw, stream.raw)

    def free(self) -> None:
        if self.raw is not None:
            self.raw.free()
            self.raw = None


def _driver() -> Any:
    import pycuda.driver  # already imported (and initialised) by pycuda_driver() before any buffer exists

    return pycuda.driver


class CudaDevice:
    """One GPU's primary context, shared by every session and thread of this process."""

    _devices: ClassVar[dict[int, CudaDevice]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, ordinal: int) -> None:
        drv = pycuda_driver()
        try:
            self.device = drv.Device(ordinal)
            self.context = self.device.retain_primary_context()
        except Exception as exc:
            raise BackendUnavailable(f"CUDA device {ordinal} cannot be used: {exc}") from exc
        self.ordinal = ordinal
        self.name = str(self.device.name())
        self.compute_capability = "{}.{}".format(*self.device.compute_capability())
        self._depth = threading.local()

    @classmethod
    def get(cls, ordinal: int = 0) -> CudaDevice:
        """The process-wide handle of device ``ordinal`` (its primary context is retained once)."""
        with cls._lock:
            dev = cls._devices.get(ordinal)
            if dev is None:
                dev = cls._devices[ordinal] = cls(ordinal)
            return dev

    # -- context -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self) -> Iterator[CudaDevice]:
        """Make the primary context current on this thread for the block (re-entrant)."""
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            self.context.push()
        self._depth.n = depth + 1
        try:
            yield self
        finally:
            self._depth.n -= 1
            if self._depth.n == 0:
                _driver().Context.pop()

    # -- allocation (call inside active()) ---------------------------------------------------------
    def pinned_empty(self, shape: tuple[int, ...], dtype: Any, mapped: bool = False) -> np.ndarray:
        """A page-locked host array: async copies from it overlap compute. ``mapped``: the GPU can read it
        directly (zero-copy, useful on Jetson where host and device share DRAM)."""
        drv = _driver()
        try:
            if mapped:
                flags = drv.host_alloc_flags.DEVICEMAP
                arr: np.ndarray = drv.pagelocked_empty(shape, dtype, mem_flags=flags)
            else:
                arr = drv.pagelocked_empty(shape, dtype)
        except Exception as exc:
            raise BackendError(f"cannot allocate {np.prod(shape) * np.dtype(dtype).itemsize} bytes of "
                               f"page-locked host memory: {exc}") from exc
        return arr

    @staticmethod
    def device_pointer_of_mapped(host: np.ndarray) -> int:
        """The device address of a ``mapped`` pinned array (its ``base`` is pycuda's HostAllocation)."""
        base = host.base
        if base is None or not hasattr(base, "get_device_pointer"):
            raise BackendError("array is not mapped page-locked memory (allocate with pinned_empty(mapped=True))")
        return int(base.get_device_pointer())

    def alloc(self, nbytes: int) -> DeviceBuffer:
        try:
            return DeviceBuffer(_driver().mem_alloc(max(int(nbytes), 1)), int(nbytes))
        except Exception as exc:
            raise BackendError(f"cannot allocate {nbytes} bytes on {self.name}: {exc}") from exc

    def stream(self) -> Stream:
        return Stream(_driver().Stream())

    def event(self) -> Event:
        return Event(_driver().Event())

    def synchronize(self) -> None:
        _driver().Context.synchronize()


def check_available() -> str:
    """A one-line description of CUDA here, or BackendUnavailable with the reason."""
    name, cc, driver = device_identity(0)
    return f"{name} (compute {cc}), CUDA driver {driver}"


# -- run-time compiled kernels and device traits (used by edgert.vision.gpu_preprocess / gpu_decode) ----


class Kernel:
    """One ``__global__`` function of a module compiled by :func:`compile_kernels`.

    ``launch`` takes numpy scalars (``np.int32``, ``np.float32``, ``np.uintp`` for device addresses) in
    the kernel's parameter order; it only enqueues the work on ``stream``. With ``handle`` (the driver's
    ``CUfunction``) the launch is one ``cuLaunchKernel`` through ``ctypes.PyDLL``, keeping the interpreter lock;
    without it, pycuda's prepared call.
    """

    def __init__(self, raw: Any, name: str, handle: int | None = None) -> None:
        self.raw = raw
        self.name = name
        self.handle = handle
        self._prepared = ""
        self._local = threading.local()  # per thread: the packed arguments and the pointers to them

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple[Any, ...],
               stream: Stream, shared: int = 0) -> None:
        if self.handle is not None:
            self._launch_direct(grid, block, args, stream, shared)
            return
        # A prepared call packs the arguments with one struct format made once, where a plain call inspects
        # every argument every time: at thousands of launches a second the difference is host time.
        # Callers pass the same numpy scalar types on every launch of a kernel (its C signature), so the
        # format is worked out on the first launch only.
        try:
            if len(self._prepared) != len(args):
                self._prepared = "".join(_STRUCT_CODES[np.dtype(type(a)).char] for a in args)
                self.raw.prepare(self._prepared)
            if shared:
                self.raw.prepared_async_call(grid, block, stream.raw, *args, shared_size=shared)
            else:
                self.raw.prepared_async_call(grid, block, stream.raw, *args)
        except Exception as exc:
            raise BackendError(f"CUDA kernel {self.name} failed to launch: {exc}") from exc

    def _launch_direct(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple[Any, ...],
                       stream: Stream, shared: int) -> None:
        # pycuda's prepared call is about ten Python-level steps per launch (block shape, pack, texrefs, launch),
        # each made with the slot thread holding the interpreter lock the other slots wait for: at 16 NanoDet
        # streams on the H200 its lines were 7 % of the lock's samples (docs/pipeline.md). Here: one
        # pack into this thread's buffer (the driver copies the parameters at launch, so the buffer is free
        # again when the call returns) and one driver call.
        local = self._local
        packed = getattr(local, "packed", None)
        if packed is None or packed[0] != len(args):
            packed = local.packed = (len(args), *_pack_layout(args))
        _, fmt, buf, params = packed
        try:
            fmt.pack_into(buf, 0, *args)
        except Exception as exc:  # struct.error: an argument of another type than on this thread's first launch
            raise BackendError(f"CUDA kernel {self.name} failed to launch: {exc}") from exc
        code = _launch_function()(self.handle, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                                  stream.handle, params, None)
        if code != 0:
            raise BackendError(f"CUDA kernel {self.name} failed to launch: CUDA error {code}")


#: numpy scalar type codes -> struct codes for pycuda's prepared calls (pointers travel as np.uintp)
_STRUCT_CODES = {"i": "i", "l": "q", "q": "q", "I": "I", "L": "Q", "Q": "Q", "f": "f", "d": "d", "P": "P"}


def _pack_layout(args: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """``(struct, buffer, void* array)`` for arguments typed as ``args``: each parameter at its C offset (native
    alignment, as the kernel's parameter list lays them out), the array pointing at each one."""
    import ctypes
    import struct

    codes = [_STRUCT_CODES[np.dtype(type(a)).char] for a in args]
    fmt = struct.Struct("@" + "".join(codes))
    buf = ctypes.create_string_buffer(max(fmt.size, 1))
    base = ctypes.addressof(buf)
    offsets = [struct.calcsize("@" + "".join(codes[:k + 1])) - struct.calcsize("@" + codes[k]) for k in
               range(len(codes))]
    params = (ctypes.c_void_p * max(len(codes), 1))(*[base + off for off in offsets])
    return fmt, buf, params


_launch: Any = None  # cuLaunchKernel through ctypes.PyDLL, looked up once


def _launch_function() -> Any:
    global _launch
    if _launch is None:
        import ctypes

        fn = _libcuda_holding_gil().cuLaunchKernel
        u = ctypes.c_uint
        fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _launch = fn
    return _launch


def _module_functions(cubin: bytes, names: tuple[str, ...]) -> dict[str, int] | None:
    """The ``CUfunction`` of each of ``names`` in ``cubin`` loaded with the driver API (in the current context);
    None where the driver cannot be reached through ctypes (then the kernels launch through pycuda)."""
    import ctypes

    try:
        lib = _libcuda_holding_gil()
    except OSError as exc:
        log.debug("libcuda through ctypes: %s; kernels launch through pycuda", exc)
        return None
    module = ctypes.c_void_p()
    code = lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin))
    if code != 0:
        log.debug("cuModuleLoadData failed with CUDA error %d; kernels launch through pycuda", code)
        return None
    found: dict[str, int] = {}
    for name in names:
        fn = ctypes.c_void_p()
        code = lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode())
        if code != 0 or not fn.value:
            raise BackendError(f"CUDA kernel {name} is not in the compiled module (CUDA error {code})")
        found[name] = int(fn.value)
    return found  # the module stays loaded for the process, as pycuda's modules of the same kernels do


def compile_kernels(source: str, names: tuple[str, ...], options: tuple[str, ...] = ()) -> dict[str, Kernel]:
    """Compile CUDA C++ ``source`` with nvcc (pycuda's compiler) for the current device; call inside
    ``CudaDevice.active()``. The source declares its kernels ``extern "C"`` itself (it may include C++
    headers such as cuda_fp16.h). pycuda caches the binary, so a second process starts fast. The module is
    loaded twice: by pycuda (its functions kept as ``Kernel.raw``) and by the driver API directly, whose
    functions are what ``Kernel.launch`` calls (the kernels have no module globals, so the copies share no state)."""
    compiler = lazy_import("pycuda.compiler", "run-time compiled CUDA kernels (nvcc must be on PATH)")
    try:
        cubin = compiler.compile(source, no_extern_c=True, options=list(options))
    except Exception as exc:  # pycuda.driver.CompileError carries nvcc's stderr
        detail = getattr(exc, "stderr", "") or str(exc)
        first = next((ln for ln in str(detail).splitlines() if "error" in ln.lower()), str(detail)[:200])
        raise BackendError(f"cannot compile CUDA kernels ({first.strip()}). Note: nvcc from the CUDA toolkit "
                           "must be on PATH (JetPack: /usr/local/cuda/bin)") from exc
    module = _driver().module_from_buffer(cubin)
    handles = _module_functions(cubin, names) or {}
    return {name: Kernel(module.get_function(name), name, handles.get(name)) for name in names}


def device_traits(device: CudaDevice) -> dict[str, bool]:
    """``integrated`` (shares DRAM with the CPU: Jetson) and ``can_map_host_memory`` of ``device``."""
    attr = _driver().device_attribute
    return {
        "integrated": bool(device.device.get_attribute(attr.INTEGRATED)),
        "can_map_host_memory": bool(device.device.get_attribute(attr.CAN_MAP_HOST_MEMORY)),
    }


def memset_d32_async(ptr: int, value: int, count: int, stream: Stream) -> None:
    """Fill ``count`` 32-bit words at device address ``ptr`` with ``value``, on ``stream``."""
    _driver().memset_d32_async(ptr, value, count, stream.raw)


def copy_dtoh_async(host: np.ndarray, ptr: int, stream: Stream) -> None:
    """Copy ``host.nbytes`` from device address ``ptr`` into the (page-locked) array ``host``."""
    _driver().memcpy_dtoh_async(host, ptr, stream.raw)


def copy_htod_async(ptr: int, host: np.ndarray, stream: Stream) -> None:
    """Copy the (page-locked) array ``host`` to device address ``ptr``."""
    _driver().memcpy_htod_async(ptr, host, stream.raw)



class HostRegistration:
    """Existing host memory page-locked with ``cuMemHostRegister`` (a shared-memory frame ring); ``ptr``: its
    device address when mapped, else 0. :meth:`close` (inside ``active()``) unregisters; the registration keeps
    the array alive until then, so the memory cannot be unmapped while CUDA still has it locked.

    Through the driver API directly: pycuda's ``register_host_memory`` builds its result array over the input's
    array interface and then fails to set that array's base a second time on current NumPy (seen on the H200
    image, pycuda 2026.1, NumPy 2).
    """

    _DEVICEMAP = 0x02  # CU_MEMHOSTREGISTER_DEVICEMAP

    def __init__(self, array: np.ndarray, mapped: bool) -> None:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        self._lib = ctypes.CDLL(name)
        self._array: np.ndarray | None = array
        self.address = int(array.__array_interface__["data"][0])
        self.nbytes = int(array.nbytes)
        flags = self._DEVICEMAP if mapped else 0
        self._check(self._lib.cuMemHostRegister_v2(ctypes.c_void_p(self.address), ctypes.c_size_t(self.nbytes),
                                                   ctypes.c_uint(flags)), "cuMemHostRegister")
        self.ptr = 0
        if mapped:
            dptr = ctypes.c_uint64(0)
            code = self._lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(self.address),
                                                          ctypes.c_uint(0))
            if code != 0:
                self.close()
                self._check(code, "cuMemHostGetDevicePointer")
            self.ptr = int(dptr.value)

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            import ctypes

            text = ctypes.c_char_p()
            self._lib.cuGetErrorString(int(code), ctypes.byref(text))
            raise BackendError(f"{what} failed: {text.value.decode() if text.value else code}")

    def close(self) -> None:
        if self._array is None:
            return
        import ctypes

        code = self._lib.cuMemHostUnregister(ctypes.c_void_p(self.address))
        if code != 0:  # the memory stays locked until the process ends: harmless, but say so
            log.warning("cuMemHostUnregister failed with CUDA error %d", code)
        self._array = None


def register_host_memory(array: np.ndarray, mapped: bool = False) -> HostRegistration:
    """Page-lock existing host memory for async copies (and, ``mapped``, zero-copy reads); call inside
    ``active()``; close the result inside ``active()`` too."""
    try:
        return HostRegistration(array, mapped)
    except OSError as exc:  # no libcuda to load
        raise BackendError(f"cannot page-lock {array.nbytes} bytes of shared frame memory: {exc}") from exc


_held_gil_functions: dict[str, Any] = {}  # the driver's functions through ctypes.PyDLL, looked up once each


def _libcuda_holding_gil() -> Any:
    import ctypes
    import ctypes.util

    return ctypes.PyDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")


def _copy_function(name: str, host_first: bool) -> Any:
    """``name`` of the driver API, ``(dst, src, bytes, stream)`` with the host address first or second, called
    with the interpreter lock kept (:func:`copy_htod_async_pinned` says why)."""
    fn = _held_gil_functions.get(name)
    if fn is None:
        import ctypes

        host, device = ctypes.c_void_p, ctypes.c_uint64
        fn = getattr(_libcuda_holding_gil(), name)
        fn.argtypes = [host, device] if host_first else [device, host]
        fn.argtypes += [ctypes.c_size_t, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _held_gil_functions[name] = fn
    return fn


def copy_htod_async_pinned(ptr: int, host: np.ndarray, stream: Stream) -> None:
    """Queue a copy of the page-locked, C-contiguous ``host`` to device address ``ptr``, keeping the GIL.

    From page-locked memory ``cuMemcpyHtoDAsync`` only queues the copy and returns in microseconds, so this
    calls it through ``ctypes.PyDLL``, which does not release the interpreter lock. pycuda's
    ``memcpy_htod_async`` releases it, and with one copy per frame every copy then waited to get the lock back
    behind the other threads: at 16 NanoDet streams on the H200 that wait was a third of each slot thread's
    time (docs/results/README.md: thread profiles). Pageable memory would make the call wait for the
    copy with the lock held: only page-locked buffers come here (the processor's own and the capture rings).
    """
    copy_htod_address_pinned(ptr, host.__array_interface__["data"][0], host.nbytes, stream)


def copy_htod_address_pinned(ptr: int, src: int, nbytes: int, stream: Stream) -> None:
    """:func:`copy_htod_async_pinned` of ``nbytes`` at the page-locked host address ``src``."""
    fn = _copy_function("cuMemcpyHtoDAsync_v2", host_first=False)
    code = fn(ptr, src, nbytes, stream.handle)
    if code != 0:
        raise BackendError(f"cuMemcpyHtoDAsync of {nbytes} bytes failed with CUDA error {code}")


def copy_dtoh_async_pinned(host: np.ndarray, ptr: int, stream: Stream) -> None:
    """Queue a copy of ``host.nbytes`` from device address ``ptr`` into the page-locked, C-contiguous ``host``,
    keeping the GIL (:func:`copy_htod_async_pinned` says why: into page-locked memory the call only queues)."""
    fn = _copy_function("cuMemcpyDtoHAsync_v2", host_first=True)
    code = fn(host.__array_interface__["data"][0], ptr, host.nbytes, stream.handle)
    if code != 0:
        raise BackendError(f"cuMemcpyDtoHAsync of {host.nbytes} bytes failed with CUDA error {code}")



_batch_copy: Any = None  # the driver's cuMemcpyBatchAsync_v2 once looked up; False where it has none


def copy_htod_batch_pinned(dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int], stream: Stream) -> bool:
    """Queue several copies from page-locked host addresses ``srcs`` to device addresses ``dsts`` with one driver
    call (``cuMemcpyBatchAsync``, CUDA 13's API), keeping the GIL; False when the driver has no such call or
    refuses it (the caller then copies one by one, :func:`copy_htod_async_pinned`).

    A batch of 16 frames was 16 ``cuMemcpyHtoDAsync`` calls, each one made while the slot's thread holds the
    interpreter lock: at 16 NanoDet streams on the H200 they were 11 % of the lock's samples (docs/pipeline.md).
    """
    global _batch_copy
    import ctypes

    if _batch_copy is None:
        try:
            fn = _libcuda_holding_gil().cuMemcpyBatchAsync_v2
        except AttributeError:  # a driver before CUDA 13 (JetPack 6: CUDA 12.x)
            _batch_copy = False
            return False

        class _Location(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

        class _Attributes(ctypes.Structure):  # CUmemcpyAttributes
            _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _Location), ("dstLocHint", _Location),
                        ("flags", ctypes.c_uint)]

        u64p = ctypes.POINTER(ctypes.c_uint64)
        fn.argtypes = [u64p, u64p, u64p, ctypes.c_size_t, ctypes.POINTER(_Attributes), u64p, ctypes.c_size_t,
                       ctypes.c_void_p]
        fn.restype = ctypes.c_int
        attrs = (_Attributes * 1)()
        attrs[0].srcAccessOrder = 1  # CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: the sources are read in stream order
        _batch_copy = (fn, attrs, (ctypes.c_uint64 * 1)(0))
    if _batch_copy is False:
        return False
    fn, attrs, first = _batch_copy
    n = len(dsts)
    arr = ctypes.c_uint64 * n
    code = fn(arr(*dsts), arr(*srcs), arr(*sizes), n, attrs, first, 1, stream.handle)
    if code != 0:
        log.warning("cuMemcpyBatchAsync failed with CUDA error %d: copying frames one by one", code)
        _batch_copy = False
        return False
    return True
