#!/usr/bin/env python3
"""Does TensorRT-RTX's *runtime* run here? Build FP32 / FP16 / INT8 engines and time them, or record the refusal.

TensorRT-RTX's support matrix lists compute capabilities 7.5 / 8.6 / 8.9 / 12.0; a data-centre Hopper (9.0,
H200) is not on it. Its builder runs anywhere (it builds on a CPU-only machine too), so engine size is a
proxy that is always measurable; latency needs the runtime. This script does both and says which:

1. Build (TensorRT-RTX builder, strongly typed network, one child process per engine so a crash is a
   record, not the end): the FP32 ONNX as given, an FP16 copy of it (``edgert.rewrite.fp16``, decoding tail
   kept FP32, as ``edgert convert --fp16`` makes it), edgert's Q/DQ INT8 model and ModelOpt's, each when
   given. Prebuilt ``.engine`` files can be given instead (``--engine NAME=PATH``).
2. Run (one child process per engine): ``Runtime.deserialize_cuda_engine``, ``create_execution_context``,
   then (only now is a CUDA allocator needed) device buffers, ``execute_async_v3``; ``--warmup`` runs, then
   the median and p90 of ``--iters`` runs.
   Every step that fails records the step, the exception and the TensorRT-RTX logger's error lines
   verbatim: the exact refusal message.

Writes JSON to ``--out`` and prints one line per engine. On a machine without a GPU it records the
refusal (no CUDA device, or no CUDA allocator module) cleanly and exits 0; exit 1 only for bad arguments.

    python scripts/trt_rtx_runtime_probe.py --fp32 M.onnx --int8 M.int8.onnx --modelopt M.modelopt.onnx \\
        --work /tmp/rtx_probe --out /tmp/rtx_probe/result.json

Device memory comes from the first of ``cuda.bindings`` (cuda-python), ``pycuda``, ``torch`` that imports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Child process: build one engine from an ONNX file. argv: onnx, engine out.
_BUILD = r"""
import json, sys, time
out = {"step": "import"}
try:
    import tensorrt_rtx as trt
    out["tensorrt_rtx"] = trt.__version__
    class L(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self); self.errors = []
        def log(self, sev, msg):
            if sev in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR): self.errors.append(str(msg))
    lg = L()
    out["step"] = "parse"
    b = trt.Builder(lg)
    n = b.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    p = trt.OnnxParser(n, lg)
    if not p.parse_from_file(sys.argv[1]):
        out["error"] = "; ".join(str(p.get_error(i)) for i in range(p.num_errors)) or "parse failed"
    else:
        out["step"] = "build"
        t = time.perf_counter()
        e = b.build_serialized_network(n, b.create_builder_config())
        out["build_s"] = round(time.perf_counter() - t, 2)
        if e is None:
            out["error"] = "build_serialized_network returned None"
        else:
            open(sys.argv[2], "wb").write(e)
            out["engine_mb"] = round(e.nbytes / 2**20, 2); out["step"] = "built"
    out["logger_errors"] = lg.errors[-5:]
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""

# Child process: deserialize, create a context, execute and time. argv: engine, warmup, iters.
_RUN = r"""
import json, sys, time
out = {"step": "import"}
def finish():
    print(json.dumps(out)); sys.exit(0)
try:
    import numpy as np
    import tensorrt_rtx as trt
    out["tensorrt_rtx"] = trt.__version__
    class L(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self); self.errors = []
        def log(self, sev, msg):
            if sev in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR): self.errors.append(str(msg))
    lg = L()
    out["step"] = "deserialize"
    runtime = trt.Runtime(lg)
    engine = runtime.deserialize_cuda_engine(open(sys.argv[1], "rb").read())
    if engine is None:
        out["error"] = "deserialize_cuda_engine returned None"; out["logger_errors"] = lg.errors[-5:]; finish()
    out["step"] = "create_execution_context"
    ctx = engine.create_execution_context()
    if ctx is None:
        out["error"] = "create_execution_context returned None"; out["logger_errors"] = lg.errors[-5:]; finish()
    out["step"] = "allocator"
    alloc = None
    try:
        from cuda.bindings import runtime as cudart
        def _ck(r):
            err = r[0] if isinstance(r, tuple) else r
            if int(err) != 0: raise RuntimeError(f"CUDA runtime error {int(err)} ({err})")
            return r[1] if isinstance(r, tuple) and len(r) > 1 else None
        n = _ck(cudart.cudaGetDeviceCount())
        if not n: raise RuntimeError("no CUDA device")
        props = _ck(cudart.cudaGetDeviceProperties(0))
        out["device"] = {"name": props.name.decode(errors="replace").rstrip("\x00"),
                         "compute_capability": f"{props.major}.{props.minor}"}
        alloc = ("cuda.bindings", lambda nbytes: _ck(cudart.cudaMalloc(nbytes)),
                 lambda: _ck(cudart.cudaStreamCreate()), lambda s: _ck(cudart.cudaStreamSynchronize(s)))
    except ImportError:
        pass
    if alloc is None:
        try:
            import pycuda.autoinit  # noqa: F401
            import pycuda.driver as cuda
            d = cuda.Device(0)
            out["device"] = {"name": d.name(), "compute_capability": "%d.%d" % d.compute_capability()}
            keep = []
            def _m(nbytes):
                keep.append(cuda.mem_alloc(nbytes)); return int(keep[-1])
            alloc = ("pycuda", _m, lambda: cuda.Stream(), lambda s: s.synchronize())
        except ImportError:
            pass
    if alloc is None:
        try:
            import torch
            if not torch.cuda.is_available(): raise RuntimeError("torch: no CUDA device")
            out["device"] = {"name": torch.cuda.get_device_name(0),
                             "compute_capability": "%d.%d" % torch.cuda.get_device_capability(0)}
            keep = []
            def _t(nbytes):
                keep.append(torch.empty(max(1, nbytes), dtype=torch.uint8, device="cuda")); return keep[-1].data_ptr()
            alloc = ("torch", _t, lambda: torch.cuda.Stream(), lambda s: s.synchronize())
        except ImportError:
            pass
    if alloc is None:
        out["error"] = "no CUDA allocator module (cuda-python, pycuda or torch) imports here"; finish()
    out["allocator"] = alloc[0]
    out["step"] = "buffers"
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = [max(1, int(d)) for d in engine.get_tensor_shape(name)]
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            ctx.set_input_shape(name, shape)
        size = int(np.prod(shape)) * np.dtype(trt.nptype(engine.get_tensor_dtype(name))).itemsize
        ctx.set_tensor_address(name, int(alloc[1](size)))
    stream = alloc[2]()
    handle = int(getattr(stream, "handle", getattr(stream, "cuda_stream", stream)))
    out["step"] = "execute"
    times = []
    for k in range(int(sys.argv[2]) + int(sys.argv[3])):
        t = time.perf_counter()
        if not ctx.execute_async_v3(handle):
            out["error"] = "execute_async_v3 returned False"; out["logger_errors"] = lg.errors[-5:]; finish()
        alloc[3](stream)
        if k >= int(sys.argv[2]): times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    out.update(step="ran", latency_ms={"median": round(times[len(times) // 2], 4),
                                       "p90": round(times[int(len(times) * 0.9)], 4), "iters": len(times)})
    out["logger_errors"] = lg.errors[-5:]
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
    try: out["logger_errors"] = lg.errors[-5:]
    except NameError: pass
print(json.dumps(out))
"""


def _child(code: str, args: list[str], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"error": f"child exited {proc.returncode} without a result (a crash: signal {-proc.returncode}"
                         f" if negative)", "stderr": proc.stderr.strip()[-1500:]}
    if proc.returncode:
        result["exit"] = proc.returncode
    if proc.stderr.strip():
        result["stderr_tail"] = proc.stderr.strip()[-800:]
    return result


def _fp16(src: Path, work: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from edgert.rewrite.fp16 import convert_file

    dst = work / f"{src.stem}.fp16.onnx"
    convert_file(src, dst)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp32", type=Path, help="FP32 ONNX (also converted to FP16 unless --no-fp16)")
    ap.add_argument("--no-fp16", action="store_true")
    ap.add_argument("--int8", type=Path, help="edgert's Q/DQ INT8 ONNX (edgert calibrate -o)")
    ap.add_argument("--modelopt", type=Path, help="ModelOpt's Q/DQ INT8 ONNX")
    ap.add_argument("--engine", action="append", default=[], metavar="NAME=PATH", help="a prebuilt engine")
    ap.add_argument("--work", type=Path, default=Path("/tmp/trt_rtx_probe"), help="engines are written here")
    ap.add_argument("--out", type=Path, required=True, help="JSON result")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per build or run")
    args = ap.parse_args()

    onnx_in: dict[str, Path] = {}
    if args.fp32:
        onnx_in["fp32"] = args.fp32
    for name, path in (("edgert_int8", args.int8), ("modelopt_int8", args.modelopt)):
        if path:
            onnx_in[name] = path
    engines: dict[str, Path] = {}
    for spec in args.engine:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            print(f"--engine {spec!r}: give NAME=PATH", file=sys.stderr)
            return 1
        engines[name] = Path(path)
    missing = [str(p) for p in [*onnx_in.values(), *engines.values()] if not p.is_file()]
    if missing or not (onnx_in or engines):
        print(f"missing file(s): {', '.join(missing)}" if missing else "nothing to probe: give --fp32/--int8/"
              "--modelopt or --engine", file=sys.stderr)
        return 1
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engines": {}}
    if args.fp32 and not args.no_fp16:
        try:
            onnx_in = {"fp32": args.fp32, "fp16": _fp16(args.fp32, args.work),
                       **{k: v for k, v in onnx_in.items() if k != "fp32"}}
        except Exception as exc:  # an edgert ModelError or onnx's: recorded, the rest still runs
            result["engines"]["fp16"] = {"build": {"error": f"FP16 conversion: {type(exc).__name__}: {exc}"}}
    for name, src in onnx_in.items():
        dst = args.work / f"{name}.engine"
        build = _child(_BUILD, [str(src), str(dst)], args.timeout)
        result["engines"][name] = {"onnx": str(src), "build": build}
        if build.get("step") == "built":
            engines[name] = dst
    for name, path in engines.items():
        entry = result["engines"].setdefault(name, {})
        entry["engine"] = str(path)
        entry["engine_mb"] = round(path.stat().st_size / 2**20, 2)
        entry["run"] = _child(_RUN, [str(path), str(args.warmup), str(args.iters)], args.timeout)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, entry in result["engines"].items():
        run = entry.get("run") or {}
        if run.get("step") == "ran":
            what = f"{run['latency_ms']['median']} ms median ({run.get('device', {}).get('name')})"
        else:
            err = run.get("error") or (entry.get("build") or {}).get("error") or "not run"
            logs = " | ".join(run.get("logger_errors") or [])
            what = f"refused at {run.get('step', 'build')}: {err}" + (f" [TensorRT-RTX: {logs}]" if logs else "")
        print(f"{name:<14} {entry.get('engine_mb', '-')!s:>8} MB  {what}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
