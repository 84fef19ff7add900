"""What a processor's first batch on a new thread costs, after its warm-up on another: the model update's case.

A model update opens and warms the candidate's processor on the update's thread, then the run's slot threads
take its batches. On an H100 (ONNX Runtime CUDA, GPU processor, NanoDet, batch 1) the output stalled 12.7 ms at
the swap, against frames 1.18 ms apart (docs/results/model-update-ort-cuda-h100-2026-12-07.json). This opens the
processor as the update does, warms it on the main thread, then times each slot's first and next batches on
threads of their own, all slots at once (as the run's slot threads meet the new model), and one slot alone. A
first batch far slower than the next ones is a cost the swap could pay before the switch instead of at it.

    python scripts/probe_first_batch.py --out probe-first-batch.json [--backend onnxruntime-cuda --processing gpu]

Prints one line per slot and writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _bench import assets_dir, machine_info, write_json


def _timed_runs(processor: Any, index: int, frame: np.ndarray, runs: int) -> list[float]:
    from edgert.stats import STAGES

    slot = processor.slots[index]
    took = []
    with slot.active():
        for _ in range(runs):
            t0 = time.perf_counter()
            slot.process([frame], [np.zeros(len(STAGES))])
            took.append(round((time.perf_counter() - t0) * 1e3, 3))
    return took


def on_threads(processor: Any, indexes: list[int], frame: np.ndarray, runs: int) -> dict[int, list[float]]:
    """Each slot of ``indexes`` runs ``runs`` batches on a new thread of its own, all started together."""
    out: dict[int, list[float]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(indexes))

    def work(k: int) -> None:
        try:
            start.wait()
            out[k] = _timed_runs(processor, k, frame, runs)
        except BaseException as exc:  # the line says which slot failed
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,), name=f"probe-slot-{k}") for k in indexes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"a slot failed: {type(errors[0]).__name__}: {errors[0]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="ONNX (default: the assets' NanoDet)")
    ap.add_argument("--backend", default="onnxruntime-cuda")
    ap.add_argument("--processing", default="gpu", choices=["cpu", "gpu"])
    ap.add_argument("--runs", type=int, default=20, help="batches per slot and thread")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from edgert.config import PipelineConfig
    from edgert.config.convert import from_mapping
    from edgert.errors import EdgertError
    from edgert.image_file import decode_image_file
    from edgert.pipeline.choice import open_processor

    assets = assets_dir()
    model = args.model or str(assets / "models" / "detection" / "nanodet-m-416-coco-v8layout.onnx")
    config = from_mapping(PipelineConfig, {"model": {"path": model, "backend": args.backend},
                                           "source": {"uri": str(assets / "video" / "vtest.avi")},
                                           "runtime": {"processing": args.processing}})
    result: dict[str, Any] = {"model": model, "backend": args.backend, "processing": args.processing,
                              "runs": args.runs}
    try:
        frame = decode_image_file(assets / "images" / "bus.jpg")
        for case in ("all slots at once", "one slot alone"):
            processor = open_processor(config, batch=1, sources=1)
            try:
                t0 = time.perf_counter()
                processor.warm_up(config.runtime.warmup)  # on this thread, as the update's thread does
                warm_s = time.perf_counter() - t0
                main_ms = _timed_runs(processor, 0, frame, args.runs)
                slots = list(range(len(processor.slots))) if case == "all slots at once" else [0]
                runs = on_threads(processor, slots, frame, args.runs)
            finally:
                processor.close()
            rows = {str(k): {"first_ms": r[0], "next_median_ms": statistics.median(r[1:]), "runs_ms": r}
                    for k, r in runs.items()}
            result[case] = {"slots": len(slots), "warm_up_s": round(warm_s, 3),
                            "main_thread_median_ms": statistics.median(main_ms), "per_slot": rows}
            for k, row in rows.items():
                print(f"{case}: slot {k}: first batch on its thread {row['first_ms']:.2f} ms, next "
                      f"{row['next_median_ms']:.2f} ms (median); on the warming thread "
                      f"{statistics.median(main_ms):.2f} ms", flush=True)
    except EdgertError as exc:
        raise SystemExit(str(exc)) from None
    result["machine"] = machine_info()
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
