"""``edgert run --gpu-pipeline``: a source through :class:`~edgert.pipeline.gpu.GpuPipeline` into sinks.

The source is read on its own thread into a bounded queue (so decoding overlaps the GPU work), or, with
``preload``, read completely into memory before the clock starts (what the benchmark does, so the CPU's
video decoding is not what is measured). Results come back in frame order and go to the sinks through
:class:`~edgert.vision.sinks.SinkWorker`. The summary has FPS, per-stage GPU times (CUDA events),
and, with a power meter (NVML on a discrete GPU, the INA3221 rails on a Jetson), watts and millijoules
per frame.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import EdgertError
from edgert.pipeline.gpu import GpuPipeline, GpuPipelineOptions

__all__ = ["run_gpu_pipeline"]

log = logging.getLogger(__name__)

_END = object()


def _power_sampler(config: PipelineConfig) -> Any:
    try:
        from edgert.power.meters import open_meter
        from edgert.power.sampler import PowerSampler

        meter = open_meter(config.power.meter)
        if not getattr(meter, "available", True):
            return None
        return PowerSampler(meter, hz=config.power.sample_hz).start()
    except (EdgertError, ImportError) as exc:
        log.info("no power readings: %s", exc)
        return None


def run_gpu_pipeline(config: PipelineConfig, options: GpuPipelineOptions, preload: bool = False) -> dict[str, Any]:
    """Run detection on ``config.source`` into ``config.sinks`` on the GPU pipeline; return the summary."""
    from edgert.vision.draw import draw_detections
    from edgert.vision.sinks import FrameResult, SinkWorker, StreamInfo, open_sink
    from edgert.vision.sources import open_source

    max_frames = config.runtime.max_frames
    with GpuPipeline(config.model.path, config, options) as pipe, open_source(config.source) as source:
        frames: list[np.ndarray] = []
        if preload:
            while max_frames is None or len(frames) < max_frames:
                f = source.read()
                if f is None:
                    break
                frames.append(f)
        workers = []
        info = StreamInfo(width=source.width, height=source.height, fps=source.fps, names=pipe.names)
        try:
            for uri in config.sinks:
                sink = open_sink(uri)
                sink.open(info)
                worker = SinkWorker(sink)
                worker.start()
                workers.append(worker)
            need_image = any(w.sink.needs_image for w in workers)
            held: dict[int, tuple[np.ndarray, float]] = {}  # frames in flight, for the image sinks
            stop = threading.Event()
            q: queue.Queue[Any] = queue.Queue(maxsize=max(4, 2 * options.slots))

            def capture() -> None:
                n = 0
                try:
                    while not stop.is_set() and (max_frames is None or n < max_frames):
                        f = source.read()
                        if f is None:
                            break
                        q.put(f)
                        n += 1
                finally:
                    q.put(_END)

            def stream() -> Iterator[np.ndarray]:
                i = 0
                if preload:
                    for f in frames:
                        if need_image:
                            held[i] = (f, time.time())
                        i += 1
                        yield f
                    return
                while True:
                    f = q.get()
                    if f is _END:
                        return
                    if need_image:
                        held[i] = (f, time.time())
                    i += 1
                    yield f

            pipe.warm_up(min(config.runtime.warmup, 2))  # more would let ORT capture graphs on this thread
            reader = None if preload else threading.Thread(target=capture, name="edgert-gpu-capture", daemon=True)
            sampler = _power_sampler(config)
            per_class: dict[str, int] = {}
            n = detections = 0
            t0 = time.perf_counter()
            if reader is not None:
                reader.start()
            try:
                for index, det in pipe.run(stream()):
                    n += 1
                    detections += len(det)
                    for name, count in det.counts().items():
                        per_class[name] = per_class.get(name, 0) + count
                    if sampler is not None:
                        sampler.frame_done()
                    if workers:
                        frame, ts = held.pop(index, (None, time.time()))
                        image = None
                        if frame is not None:
                            image = frame.copy()
                            draw_detections(image, det)
                        for w in workers:
                            w.offer(FrameResult(index, ts, det, image))
            finally:
                stop.set()
                if reader is not None:
                    while reader.is_alive():  # unblock a capture thread waiting on a full queue
                        try:
                            q.get_nowait()
                        except queue.Empty:
                            reader.join(0.05)
                seconds = time.perf_counter() - t0
                power = None
                if sampler is not None:
                    sampler.stop()
                    power = sampler.summary()
        finally:
            for w in workers:
                w.close()
        summary: dict[str, Any] = {
            "pipeline": "gpu",
            "model": str(config.model.path),
            "backend": options.backend,
            "source": source.info(),
            "preloaded": preload,
            "frames": n,
            "seconds": round(seconds, 3),
            "fps": round(n / seconds, 1) if seconds > 0 else None,
            "gpu_stages_ms": pipe.stage_times(),
            "detections": detections,
            "detections_per_class": dict(sorted(per_class.items(), key=lambda kv: -kv[1])),
            "sinks": [w.sink.uri for w in workers],
            "dropped": sum(w.dropped for w in workers),
            **pipe.describe(),
        }
        if power is not None:
            summary["power"] = power
            summary["watts"] = power.get("avg_w")
            summary["mj_per_frame"] = power.get("mj_per_frame")
        return summary
