"""Make the demo data that ships inside the package (``edgert/demo_data/``) from the full assets.

``edgert demo`` runs on a fresh clone with nothing beside it, so the package carries a small detector and
a short clip, cut from the assets (whose provenance and licences ``../shared/assets/README.md`` gives):

- ``nanodet-m-416-int8w.onnx``: NanoDet-m COCO (``models/detection/nanodet-m-416-coco-v8layout.onnx``) with
  every Conv weight stored as symmetric per-output-channel INT8 and a ``DequantizeLinear`` in front of the
  Conv, so it computes in float32 on ONNX Runtime and builds on TensorRT (weight-only quantization: 15 MB
  -> about 4 MB). The activations, the -inf padding, the decoding tail and the biases stay float32.
- ``vtest-384x288.mp4``: the first ``--frames`` frames of ``video/vtest.avi`` (768x576, 10 fps) at half size,
  H.264 through PyAV's libx264 (``pip install av``), which every OpenCV with FFmpeg decodes.

``val-labels.json`` (the people in 8 frames of the clip, for ``edgert val``) is not made here: FP32 NanoDet
proposed the boxes and each frame was checked by eye (``edgert/demo_data/LICENSES`` says how); a new clip
needs new labels made the same way.

Run it again to reproduce the files (the clip is byte-identical only with the same libx264); it prints
sizes, sha256.

    python scripts/make_demo_data.py --assets ../shared/assets
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "edgert" / "demo_data"
MODEL_IN = "models/detection/nanodet-m-416-coco-v8layout.onnx"
VIDEO_IN = "video/vtest.avi"
MODEL_OUT = "nanodet-m-416-int8w.onnx"
VIDEO_OUT = "vtest-384x288.mp4"


def quantize_weights(src: Path, dst: Path) -> None:
    """Conv weights -> INT8 (per output channel, symmetric, scale = max|w| / 127) + DequantizeLinear."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    conv_weights = {n.input[1] for n in graph.node if n.op_type == "Conv" and len(n.input) > 1}
    new_nodes = []
    for name in sorted(conv_weights):
        init = inits.get(name)
        if init is None:
            continue
        w = numpy_helper.to_array(init).astype(np.float32)
        scale = np.abs(w.reshape(w.shape[0], -1)).max(axis=1) / 127.0
        scale[scale == 0] = 1.0  # an all-zero channel: any scale gives zeros
        q = np.clip(np.round(w / scale.reshape(-1, *([1] * (w.ndim - 1)))), -127, 127).astype(np.int8)
        graph.initializer.remove(init)
        graph.initializer.extend([numpy_helper.from_array(q, f"{name}_int8"),
                                  numpy_helper.from_array(scale.astype(np.float32), f"{name}_scale")])
        # DequantizeLinear, not Cast + Mul: TensorRT accepts an INT8 constant only in front of a
        # DequantizeLinear (weight-only quantization; TensorRT-RTX builds this model), and ONNX Runtime runs
        # it everywhere (it dequantizes on each run: slower than FP32 on a CPU, still real-time on the clip).
        new_nodes.append(helper.make_node("DequantizeLinear", [f"{name}_int8", f"{name}_scale"], [name],
                                          name=f"{name}_dequantize", axis=0))
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(new_nodes + nodes)  # the weights' DequantizeLinear first: the graph stays sorted
    meta = {p.key: p.value for p in model.metadata_props}
    meta.update({"edgert_demo": "NanoDet-m COCO, INT8 weights (scripts/make_demo_data.py)"})
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))


def cut_video(src: Path, dst: Path, frames: int, scale: float) -> None:
    import av
    import cv2

    cap = cv2.VideoCapture(str(src))
    fps = cap.get(cv2.CAP_PROP_FPS) or 10.0
    w = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH) * scale) // 2 * 2
    h = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT) * scale) // 2 * 2
    from fractions import Fraction

    with av.open(str(dst), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        # crf 28, one thread: small, and the same bytes on every run of the same libx264
        stream.options = {"crf": "28", "preset": "slow", "threads": "1", "movflags": "+faststart"}
        for _ in range(frames):
            ok, frame = cap.read()
            if not ok:
                break
            small = cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA)
            for packet in stream.encode(av.VideoFrame.from_ndarray(small, format="bgr24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    cap.release()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assets", default=os.environ.get("EDGERT_ASSETS", str(ROOT.parent / "shared" / "assets")))
    ap.add_argument("--frames", type=int, default=200, help="frames of vtest.avi to keep (default 200: 20 s)")
    ap.add_argument("--scale", type=float, default=0.5, help="size of the clip against the original")
    args = ap.parse_args()
    assets = Path(args.assets)
    OUT.mkdir(parents=True, exist_ok=True)
    quantize_weights(assets / MODEL_IN, OUT / MODEL_OUT)
    cut_video(assets / VIDEO_IN, OUT / VIDEO_OUT, args.frames, args.scale)
    for name in (MODEL_OUT, VIDEO_OUT):
        data = (OUT / name).read_bytes()
        print(f"{name}: {len(data) / 1e6:.2f} MB sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
