"""What machine is this: OS, CPU, Jetson model and JetPack, GPU, and the inference stacks present.

Each probe is independent and returns plain data; none may raise, so ``edgert info`` always prints a
whole report. Files are read under ``EDGERT_SYSROOT`` when it is set, so tests can point the probes at
a fake Jetson root built from the real file formats.
"""

from __future__ import annotations

import glob
import logging
import os
import platform as _platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgert._lazy import lazy_import
from edgert.errors import BackendUnavailable

log = logging.getLogger(__name__)

__all__ = ["gpu_present", "jetpack_for_l4t", "jetson_info", "machine_facts", "sysroot"]

# L4T release (from /etc/nv_tegra_release) -> JetPack, after NVIDIA's JetPack archive and jetson-stats.
L4T_TO_JETPACK: dict[str, str] = {
    "39.2.1": "7.2.1", "39.2.0": "7.2", "38.4.0": "7.1", "38.2.1": "7.0", "38.2.0": "7.0",
    "36.5.0": "6.2.2", "36.4.4": "6.2.1", "36.4.3": "6.2", "36.4.2": "6.1 (rev1)", "36.4.0": "6.1",
    "36.3.0": "6.0", "36.2.0": "6.0 DP",
    "35.6.1": "5.1.5", "35.6.0": "5.1.4", "35.5.0": "5.1.3", "35.4.1": "5.1.2", "35.3.1": "5.1.1",
    "35.2.1": "5.1", "35.1.0": "5.0.2", "34.1.1": "5.0.1 DP", "34.1.0": "5.0 DP",
    "32.7.6": "4.6.6", "32.7.5": "4.6.5", "32.7.4": "4.6.4", "32.7.3": "4.6.3", "32.7.2": "4.6.2",
    "32.7.1": "4.6.1", "32.6.1": "4.6", "32.5.1": "4.5.1", "32.5.0": "4.5",
}  # fmt: skip
# For a release the table has not heard of, only the major line is certain.
_JETPACK_MAJOR = {"32": "4.x", "34": "5.x", "35": "5.x", "36": "6.x", "38": "7.x", "39": "7.x"}
_L4T_LINE = re.compile(r"R(\d+)\s*\(release\),\s*REVISION:\s*(\d+(?:\.\d+)*)")


def sysroot() -> Path:
    return Path(os.environ.get("EDGERT_SYSROOT", "/"))


def _read(rel: str) -> str | None:
    try:
        return (sysroot() / rel).read_text(errors="replace").strip("\x00\n ")
    except OSError:
        return None


def jetpack_for_l4t(l4t: str) -> str | None:
    parts = l4t.split(".")
    while len(parts) < 3:
        parts.append("0")
    exact = L4T_TO_JETPACK.get(".".join(parts[:3]))
    return exact or _JETPACK_MAJOR.get(parts[0])


def jetson_info() -> dict[str, Any]:
    """Model, L4T and JetPack of a Jetson, or ``{"is_jetson": False}``."""
    model = _read("proc/device-tree/model")
    compatible = _read("proc/device-tree/compatible") or ""
    release = _read("etc/nv_tegra_release")
    is_jetson = bool(release) or "nvidia,tegra" in compatible or bool(model and "jetson" in model.lower())
    if not is_jetson:
        return {"is_jetson": False}
    info: dict[str, Any] = {"is_jetson": True, "model": model}
    if release:
        m = _L4T_LINE.search(release)
        if m:
            l4t = f"{m.group(1)}.{m.group(2)}"
            info["l4t"] = l4t
            info["jetpack"] = jetpack_for_l4t(l4t)
    return info


def gpu_present() -> tuple[bool, str]:
    """Whether a CUDA GPU is visible, without initialising CUDA. Never raises."""
    root = sysroot()
    for node in ("dev/nvidia0", "dev/nvgpu/igpu0", "dev/nvhost-ctrl-gpu"):
        if (root / node).exists():
            return True, f"/{node} exists"
    if _read("etc/nv_tegra_release"):
        return True, "Jetson (integrated GPU)"
    return False, "no NVIDIA GPU device node (/dev/nvidia0, /dev/nvgpu/igpu0)"


def _probe_gpu() -> dict[str, Any]:
    present, why = gpu_present()
    out: dict[str, Any] = {"present": present, "why": why}
    if not present:
        return out
    try:
        pynvml = lazy_import("pynvml")
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            out["name"] = name.decode() if isinstance(name, bytes) else name
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            out["compute_capability"] = f"{major}.{minor}"
            out["driver"] = pynvml.nvmlSystemGetDriverVersion()
            out["source"] = "nvml"
        finally:
            pynvml.nvmlShutdown()
        return out
    except Exception as exc:  # NVML answers "not supported" on Orin; pycuda may still know
        out["nvml"] = f"unavailable: {exc}"
    try:
        cuda = lazy_import("pycuda.driver")
        cuda.init()
        dev = cuda.Device(0)
        out["name"] = dev.name()
        out["compute_capability"] = "{}.{}".format(*dev.compute_capability())
        out["cuda_driver"] = ".".join(str(x) for x in cuda.get_driver_version_tuple()) if hasattr(
            cuda, "get_driver_version_tuple") else cuda.get_driver_version()
        out["source"] = "pycuda"
    except Exception as exc:
        out["pycuda"] = f"unavailable: {exc}"
    return out


def _version_of(module: str) -> dict[str, Any]:
    try:
        mod = lazy_import(module)
    except BackendUnavailable as exc:
        return {"installed": False, "why": str(exc)}
    except Exception as exc:  # a broken install must not break the report
        return {"installed": False, "why": f"import failed: {exc}"}
    return {"installed": True, "version": str(getattr(mod, "__version__", "?"))}


def _probe_onnxruntime() -> dict[str, Any]:
    out = _version_of("onnxruntime")
    if out["installed"]:
        out["providers"] = list(lazy_import("onnxruntime").get_available_providers())
    return out


def _probe_opencv() -> dict[str, Any]:
    out = _version_of("cv2")
    if out["installed"]:
        build = lazy_import("cv2").getBuildInformation()
        m = re.search(r"GStreamer:\s+(\S+)", build)
        out["gstreamer"] = bool(m and m.group(1).upper() == "YES")
    return out


def _probe_cuda() -> dict[str, Any]:
    root = sysroot()
    for rel in ("usr/local/cuda/version.json", "usr/local/cuda/version.txt"):
        text = _read(rel)
        if text:
            m = re.search(r'"cuda"\s*:\s*\{[^}]*"version"\s*:\s*"([\d.]+)"', text) or re.search(
                r"CUDA Version ([\d.]+)", text)
            if m:
                return {"version": m.group(1), "source": f"/{rel}"}
    nvcc = shutil.which("nvcc") if str(root) == "/" else None
    if nvcc:
        try:
            text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=10).stdout
            m = re.search(r"release ([\d.]+)", text)
            if m:
                return {"version": m.group(1), "source": "nvcc"}
        except (OSError, subprocess.SubprocessError):  # a broken nvcc means "not found", like no nvcc
            log.debug("nvcc --version failed", exc_info=True)
    return {"version": None}


def _probe_cameras() -> list[str]:
    return sorted(str(Path("/") / Path(p).relative_to(sysroot())) for p in glob.glob(str(sysroot() / "dev/video*")))


def _probe_power_mode() -> dict[str, Any]:
    if str(sysroot()) != "/":
        text = _read("var/lib/nvpmodel/status")  # pmode:0000 on JetPack; enough to name the mode id
        return {"mode": text} if text else {"mode": None, "why": "nvpmodel not available"}
    exe = shutil.which("nvpmodel")
    if not exe:
        return {"mode": None, "why": "nvpmodel not found (not a Jetson)"}
    try:
        text = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"mode": None, "why": str(exc)}
    m = re.search(r"NV Power Mode:\s*(\S+)", text)
    return {"mode": m.group(1) if m else text.strip() or None}


def _probe_system() -> dict[str, Any]:
    cpu = _platform.processor() or _platform.machine()
    text = _read("proc/cpuinfo") or ""
    m = re.search(r"model name\s*:\s*(.+)", text)
    if m:
        cpu = m.group(1).strip()
    return {
        "os": f"{_platform.system()} {_platform.release()}",
        "machine": _platform.machine(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }


def _safe(probe: Callable[[], Any]) -> Any:
    try:
        return probe()
    except Exception as exc:  # one failing probe must not hide the others
        log.debug("probe %s failed", probe.__name__, exc_info=True)
        return {"error": f"{type(exc).__name__}: {exc}"}


def machine_facts() -> dict[str, Any]:
    """What this machine is, as JSON-ready data: every probe of ``edgert info`` (which adds the backend).

    One failing probe is reported as ``{"error": ...}`` and never hides the others.
    """
    return {
        "system": _safe(_probe_system),
        "jetson": _safe(jetson_info),
        "gpu": _safe(_probe_gpu),
        "cuda": _safe(_probe_cuda),
        "tensorrt": _safe(lambda: _version_of("tensorrt")),
        "tensorrt_rtx": _safe(lambda: _version_of("tensorrt_rtx")),
        "onnxruntime": _safe(_probe_onnxruntime),
        "pycuda": _safe(lambda: _version_of("pycuda")),
        "opencv": _safe(_probe_opencv),
        "cameras": _safe(_probe_cameras),
        "power_mode": _safe(_probe_power_mode),
    }
