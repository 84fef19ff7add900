"""GPU check, run on a CUDA machine (the H200 device) by scripts/gpu_check.sh.

1. The CUDA helpers of edgert.backends.cuda on their own: primary context push/pop on two threads, pinned
   and mapped host memory, device buffers, stream, events (round trip equality).
2. The ONNX Runtime CUDA session (pycuda device buffers bound through IOBinding, our stream as
   ``user_compute_stream``, pinned host buffers) against the CPU backend on the three detectors, on real
   images: raw output difference and the detections after decoding (edgert.vision.Detector).
3. ``edgert bench`` for the three detectors on onnxruntime-cuda (and onnxruntime CPU for reference).

Writes JSON to OUT_DIR (argument 1) and prints a summary. Exit 1 when detections differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

DETECTORS = ("yolov8s-fall-640.onnx", "nanodet-m-416-coco-v8layout.onnx", "yolov3-tiny-coco-416.onnx")
IMAGES = ("bus.jpg", "zidane.jpg", "darknet_dog.jpg", "darknet_horses.jpg", "darknet_person.jpg",
          "opencv_messi5.jpg", "darknet_kite.jpg", "opencv_basketball1.png")


def check_cuda_helpers() -> dict[str, object]:
    from edgert.backends.cuda import CudaDevice, device_identity

    dev = CudaDevice.get(0)
    out: dict[str, object] = {"device": list(device_identity(0))}
    errors: list[str] = []

    def worker(seed: int) -> None:
        try:
            with dev.active():
                host = dev.pinned_empty((1024, 1024), np.float32)
                back = dev.pinned_empty((1024, 1024), np.float32)
                host[...] = np.random.default_rng(seed).random(host.shape, dtype=np.float32)
                buf = dev.alloc(host.nbytes)
                s = dev.stream()
                e0, e1 = dev.event(), dev.event()
                e0.record(s)
                buf.copy_from_host_async(host, s)
                buf.copy_to_host_async(back, s)
                e1.record(s)
                s.synchronize()
                if not np.array_equal(host, back):
                    errors.append(f"thread {seed}: round trip differs")
                out[f"roundtrip_ms_thread{seed}"] = e1.elapsed_ms(e0)
                mapped = dev.pinned_empty((16,), np.float32, mapped=True)
                out["mapped_device_ptr_nonzero"] = dev.device_pointer_of_mapped(mapped) != 0
                buf.free()
                # pycuda objects must be released with the context current on this thread.
                del host, back, mapped, s, e0, e1
        except Exception as exc:  # report, don't stop the check
            errors.append(f"thread {seed}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["errors"] = errors
    out["ok"] = not errors
    return out


def _match(a, b) -> dict[str, object]:
    """Compare two Detections: same count and classes, boxes within 0.5 px, scores within 1e-3."""
    if len(a.confidence) != len(b.confidence):
        return {"same": False, "why": f"{len(a.confidence)} vs {len(b.confidence)} detections"}
    if len(a.confidence) == 0:
        return {"same": True, "n": 0}
    ia, ib = np.argsort(-a.confidence, kind="stable"), np.argsort(-b.confidence, kind="stable")
    box = float(np.abs(a.xyxy[ia] - b.xyxy[ib]).max())
    score = float(np.abs(a.confidence[ia] - b.confidence[ib]).max())
    classes = bool(np.array_equal(a.class_id[ia], b.class_id[ib]))
    return {"same": classes and box < 0.5 and score < 1e-3, "n": len(a.confidence), "max_box_px": box,
            "max_score": score, "classes_equal": classes}


def compare_detectors(assets: Path) -> dict[str, object]:
    import cv2

    from edgert.vision.detector import Detector

    results: dict[str, object] = {}
    for name in DETECTORS:
        model = assets / "models" / "detection" / name
        rows = []
        with Detector(model, backend="onnxruntime") as cpu, Detector(model, backend="onnxruntime-cuda") as gpu:
            for img in IMAGES:
                frame = cv2.imread(str(assets / "images" / img))
                if frame is None:
                    continue
                d_cpu = cpu(frame)
                raw_cpu = {k: v.copy() for k, v in cpu.session.outputs.items()}
                d_gpu = gpu(frame)
                raw = max(float(np.abs(raw_cpu[k] - gpu.session.outputs[k]).max()) for k in raw_cpu)
                scale = max(float(np.abs(v).max()) for v in raw_cpu.values())
                m = _match(d_cpu, d_gpu)
                m.update({"image": img, "max_abs_output_diff": raw, "output_abs_max": scale,
                          "top": [(d_cpu.names[int(c)] if d_cpu.names else int(c), round(float(s), 3))
                                  for c, s in zip(d_cpu.class_id[:3], d_cpu.confidence[:3])]})
                rows.append(m)
        results[name] = {"images": rows, "all_same": all(r["same"] for r in rows)}
        print(f"{name}: {sum(r['same'] for r in rows)}/{len(rows)} images with the same detections on "
              f"CPU and CUDA; max raw diff {max(r['max_abs_output_diff'] for r in rows):.2e}", flush=True)
    return results


def bench(assets: Path, out_dir: Path) -> dict[str, object]:
    results: dict[str, object] = {}
    for name in DETECTORS:
        model = assets / "models" / "detection" / name
        for backend, iters, warm in (("onnxruntime-cuda", 500, 50), ("onnxruntime", 30, 3)):
            cmd = [sys.executable, "-m", "edgert.cli.main", "bench", str(model), "--backend", backend,
                   "--iterations", str(iters), "--warmup", str(warm), "--json"]
            if backend == "onnxruntime-cuda":
                cmd.append("--power")
            t0 = time.time()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            key = f"{name}|{backend}"
            if proc.returncode != 0:
                results[key] = {"error": proc.stderr.strip()[-2000:]}
                print(f"bench {key}: FAILED {proc.stderr.strip()[-500:]}", flush=True)
                continue
            res = json.loads(proc.stdout)
            res["command"] = " ".join(["edgert", *cmd[3:]]).replace(str(assets), "$EDGERT_ASSETS")
            res["wall_s"] = round(time.time() - t0, 1)
            results[key] = res
            g = res.get("gpu") or {}
            print(f"bench {key}: p50 {res['latency_ms']['p50']:.3f} ms, {res['throughput_fps']:.1f} fps"
                  + (f", compute-only {g['compute_only_fps']:.1f} fps, ratio {g['end_to_end_over_compute']:.3f}"
                     if g else ""), flush=True)
    return results


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    assets = Path(os.environ["EDGERT_ASSETS"])
    report: dict[str, object] = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    report["cuda_helpers"] = check_cuda_helpers()
    print("cuda helpers:", json.dumps(report["cuda_helpers"]), flush=True)
    report["same_detections"] = compare_detectors(assets)
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    report["bench"] = bench(assets, out_dir)
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    ok = bool(report["cuda_helpers"]["ok"]) and all(  # type: ignore[index]
        v["all_same"] for v in report["same_detections"].values())  # type: ignore[union-attr]
    print("gpu check:", "OK" if ok else "DIFFERENCES FOUND", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
