"""How scripts/bench_calibration.py runs the tools it compares: each in a child process whose wall time and
peak RSS a wrapper measures, and NVIDIA ModelOpt in a throwaway venv of its own (never in edgert's
dependencies). Run as a script, this module is that wrapper: ``python _quant_tools.py -- CMD ...``.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _bench import ROOT

__all__ = ["measured", "modelopt_env", "modelopt_quantize", "venv_python"]


# -- measuring a child ---------------------------------------------------------------------------------
def measured(cmd: list[str], timeout: float = 3600) -> dict[str, Any]:
    """Run ``cmd`` through a wrapper process that reports the child's wall time and peak RSS."""
    wrapper = [sys.executable, __file__, "--", *cmd]  # this module as the wrapper: see the end
    proc = subprocess.run(wrapper, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    try:
        info: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"rc": proc.returncode, "error": proc.stderr[-2000:]}
    info["stdout"] = "\n".join(lines[:-1])
    info["stderr"] = proc.stderr[-4000:]
    return info


def _measure_child(cmd: list[str]) -> int:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    print(json.dumps({"rc": proc.returncode, "wall_s": round(wall, 2), "peak_rss_mb": round(rss_mb, 1)}))
    return 0


# -- ModelOpt, in a venv of its own ------------------------------------------------------------------------
MODELOPT_CHECK = "import modelopt, modelopt.onnx.quantization, torch, onnxruntime; " \
                 "print(modelopt.__version__, torch.__version__, onnxruntime.__version__)"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def modelopt_env(venv: Path, spec: str, torch_spec: str) -> dict[str, Any]:
    """The throwaway venv with ModelOpt's ONNX path: reused when it imports, else created and installed.

    torch goes in first from ``torch_spec`` (``modelopt.onnx.quantization`` imports it at module level,
    for FP8 casts; the INT8 path never calls it), so pip does not pull PyPI's CUDA build for it."""
    py = venv_python(venv)
    info: dict[str, Any] = {"venv": str(venv), "spec": spec, "torch_spec": torch_spec}
    if py.exists():
        probe = subprocess.run([str(py), "-c", MODELOPT_CHECK], capture_output=True, text=True)
        if probe.returncode == 0:
            info.update(reused=True, versions=probe.stdout.strip())
            return info
    t0 = time.perf_counter()
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(py), "-m", "pip", "install", "-q", torch_spec],
             [str(py), "-m", "pip", "install", "-q", spec]]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            info.update(error=f"{' '.join(cmd)} failed (rc {proc.returncode})", pip_stderr=proc.stderr[-3000:])
            return info
    probe = subprocess.run([str(py), "-c", MODELOPT_CHECK], capture_output=True, text=True)
    info["install_s"] = round(time.perf_counter() - t0, 1)
    if probe.returncode != 0:
        info["error"] = f"installed, but it does not import: {probe.stderr.strip()[-2000:]}"
        return info
    info.update(reused=False, versions=probe.stdout.strip())
    return info


def modelopt_quantize(venv: Path, model: Path, npz: Path, out: Path, work: Path,
                      extra: list[str]) -> dict[str, Any]:
    """``python -m modelopt.onnx.quantization --quantize_mode int8`` (plus ``extra``; none: its defaults) on a
    copy of ``model`` in the folder ``work``: ModelOpt writes intermediate files beside its input, and
    copies the whole folder of a read-only one first."""
    work.mkdir(parents=True, exist_ok=True)
    src = work / model.name
    shutil.copy(model, src)
    cmd = [str(venv_python(venv)), "-m", "modelopt.onnx.quantization", "--onnx_path", str(src),
           "--quantize_mode", "int8", "--calibration_data_path", str(npz), "--output_path", str(out), *extra]
    info = measured(cmd)
    info["command"] = " ".join(cmd)
    info.pop("stdout", None)
    if info.get("rc") != 0 or not out.exists():
        info["error"] = (info.get("stderr") or info.get("error") or "")[-2000:]
    info.pop("stderr", None)
    return info


if __name__ == "__main__":
    sys.exit(_measure_child(sys.argv[2:]))
