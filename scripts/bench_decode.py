#!/usr/bin/env python3
"""How fast this machine decodes N copies of a video at once with OpenCV, with no model: the ceiling a
many-stream pipeline cannot pass. One thread per stream (as the pipeline's sources), each reading into
its own reused buffer; FFmpeg's own threads per stream from ``--threads`` (0: OpenCV's default).

    python3 scripts/bench_decode.py VIDEO --streams 1,8 --frames 800 [--threads 0,1,2] --out decode.json
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import cv2
from _bench import machine_info, write_json


def decode(video: str, streams: int, frames: int, threads: int) -> float:
    caps = []
    for _ in range(streams):
        params = [cv2.CAP_PROP_N_THREADS, threads] if threads else []
        cap = cv2.VideoCapture(video, cv2.CAP_FFMPEG, params)
        if not cap.isOpened():
            raise SystemExit(f"{video}: cannot open")
        caps.append(cap)
    done = [0] * streams

    def run(k: int) -> None:
        cap, buf = caps[k], None
        while done[k] < frames:
            ok, buf = cap.read(buf)
            if not ok:
                cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
                continue
            done[k] += 1

    workers = [threading.Thread(target=run, args=(k,)) for k in range(streams)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("video")
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--frames", type=int, default=800)
    ap.add_argument("--threads", default="0", help="FFmpeg threads per stream to try (0: OpenCV's default)")
    ap.add_argument("--out", default="decode.json")
    args = ap.parse_args()
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        for n in (int(s) for s in args.streams.split(",")):
            fps = decode(args.video, n, args.frames, threads)
            rows.append({"streams": n, "ffmpeg_threads": threads, "decode_fps": round(fps, 1)})
            print(f"streams {n} threads {threads or 'default'}: {fps:.0f} frames/s decoded")
    write_json(args.out, {"machine": machine_info(), "video": args.video, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
