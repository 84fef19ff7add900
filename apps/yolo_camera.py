#!/usr/bin/env python3
"""Real-time YOLO detection from a camera (or any source URI) into the sinks you choose.

    python apps/yolo_camera.py --model yolov8n.onnx --source /dev/video0 --sink http://127.0.0.1:8080
    python apps/yolo_camera.py --model yolov8n.engine --source csi://0 --sink out.mp4 --max-frames 300

Uses only edgert's public API: a config, a Pipeline, and an observer that prints a status line.
"""

from __future__ import annotations

import argparse
import sys

from edgert import EdgertError
from edgert.config import DecodeConfig, ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.pipeline import BaseObserver, Pipeline, PipelineStats


class StatusLine(BaseObserver):
    """Print FPS, latency and drops about once a second (every ``every`` frames)."""

    def __init__(self, every: int = 30) -> None:
        self.every = every

    def on_start(self, info: dict) -> None:
        print(f"running {info['model']} on {info['backend']}, source {info['source']}", file=sys.stderr)

    def on_frame(self, stats: PipelineStats) -> None:
        if stats.frames % self.every == 0:
            total = stats.latency["total"].quantiles_ms()
            print(f"{stats.frames:6d} frames  {stats.fps:5.1f} fps  latency p50 {total['p50']:.0f} ms  "
                  f"dropped {stats.dropped}", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="ONNX model or TensorRT engine")
    p.add_argument("--source", default="/dev/video0", help="camera or video URI (default %(default)s)")
    p.add_argument("--sink", action="append", default=[], help="output URI, repeatable")
    p.add_argument("--conf", type=float, default=0.3, help="confidence threshold")
    p.add_argument("--width", type=int, help="camera width")
    p.add_argument("--height", type=int, help="camera height")
    p.add_argument("--max-frames", type=int, help="stop after N frames")
    args = p.parse_args()

    config = PipelineConfig(
        model=ModelConfig(path=args.model),
        decode=DecodeConfig(conf=args.conf),
        source=SourceConfig(uri=args.source, width=args.width, height=args.height),
        sinks=tuple(args.sink) or ("http://127.0.0.1:8080",),
        runtime=RuntimeConfig(queue_size=3, max_frames=args.max_frames),
    )
    try:
        summary = Pipeline(config, observers=[StatusLine()]).run()  # Ctrl-C stops cleanly
    except EdgertError as exc:
        print(f"yolo_camera: {exc}", file=sys.stderr)
        return 1
    print(f"{summary['frames']} frames at {summary['fps']} fps; detections: {summary['detections_per_class']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
