"""The TensorRT-RTX engine size of a Q/DQ model: the proxy for INT8's gain that any machine can measure.

TensorRT-RTX's builder runs without a GPU, so ``edgert calibrate --engine-size`` builds the calibrated
model as a strongly typed network and reports the serialized engine's size (float islands keep float
weights and add reformats: a larger engine than ModelOpt's says INT8 gave less). The build runs in a child
process: a builder crash or its memory peak stays out of the calibration's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgert._lazy import is_importable

__all__ = ["rtx_engine_size"]

_BUILD = (
    "import json,sys,time,tensorrt_rtx as trt\n"
    "lg=trt.Logger(trt.Logger.ERROR);b=trt.Builder(lg)\n"
    "n=b.create_network(1<<int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED));p=trt.OnnxParser(n,lg)\n"
    "ok=p.parse_from_file(sys.argv[1]);errs=[str(p.get_error(i)) for i in range(p.num_errors)]\n"
    "t=time.time();e=b.build_serialized_network(n,b.create_builder_config()) if ok else None\n"
    "print(json.dumps({'built':e is not None,'errors':errs[:3],"
    "'engine_mb':round(e.nbytes/2**20,2) if e else None,'build_s':round(time.time()-t,2),"
    "'tensorrt_rtx':trt.__version__}))\n"
)


def rtx_engine_size(model: str | Path, timeout: float = 1800) -> dict[str, Any]:
    """``{"built", "engine_mb", "build_s", "tensorrt_rtx"}``, or ``{"built": False, "why": ...}``."""
    if not is_importable("tensorrt_rtx"):
        return {"built": False, "why": "tensorrt_rtx is not installed (pip install 'edgert[rtx]')"}
    try:
        proc = subprocess.run([sys.executable, "-c", _BUILD, str(model)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"built": False, "why": f"the TensorRT-RTX build took over {timeout:g} s"}
    try:
        out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"built": False, "why": f"the TensorRT-RTX build exited {proc.returncode}: "
                                      f"{proc.stderr.strip()[-300:] or 'no message'}"}
    if not out.get("built"):
        out["why"] = "; ".join(out.get("errors") or []) or "the builder returned no engine"
    return out
