"""Real media and models the pipeline tests make: small videos, image folders, tiny detector models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgert.errors import SourceError
from edgert.io.sources import FrameSource


def make_video(path: Path, frames: int = 30, size: tuple[int, int] = (96, 64), fps: float = 10.0,
               fourcc: str = "MJPG") -> Path:
    """A real video file: frame ``i`` is grey level ``8*i`` with the number ``i`` written on it."""
    import cv2

    width, height = size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (width, height))
    assert writer.isOpened(), f"cannot write test video {path}"
    for i in range(frames):
        img = np.full((height, width, 3), (8 * i) % 256, np.uint8)
        cv2.putText(img, str(i), (4, height - 8), cv2.FONT_HERSHEY_SIMPLEX, 1.0, (255, 255, 255), 2)
        writer.write(img)
    writer.release()
    return path


def cut_clip(src: Path, out: Path, start: int, frames: int, fps: float = 10.0) -> Path:
    """Frames ``start..start+frames`` of the video ``src`` as a new Motion-JPEG file of nominal rate ``fps``."""
    import cv2

    cap = cv2.VideoCapture(str(src))
    cap.set(cv2.CAP_PROP_POS_FRAMES, start)
    writer = None
    for _ in range(frames):
        ok, frame = cap.read()
        assert ok
        if writer is None:
            writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"MJPG"), fps, (frame.shape[1], frame.shape[0]))
        writer.write(frame)
    assert writer is not None
    writer.release()
    cap.release()
    return out


def corrupt_avi_frame(src: Path, dst: Path, frame: int) -> Path:
    """Copy an MJPG AVI and wipe the JPEG data of one frame (a damaged frame inside a valid file)."""
    data = bytearray(src.read_bytes())
    chunks = []
    start = 0
    while True:
        k = data.find(b"00dc", start)
        if k < 0:
            break
        size = int.from_bytes(data[k + 4:k + 8], "little")
        if data[k + 8:k + 10] == b"\xff\xd8":  # a frame chunk (the idx1 index also says 00dc)
            chunks.append((k + 8, size))
        start = k + 4
    offset, size = chunks[frame]
    data[offset:offset + size] = b"\x55" * size
    dst.write_bytes(bytes(data))
    return dst


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def tiny_detector(path: Path, size: int = 32, box: tuple[float, float, float, float] = (16, 16, 8, 8),
                  scores: tuple[float, ...] = (0.9, 0.1), dynamic_batch: bool = False) -> Path:
    """A YOLOv8-layout detector ([1,4+C,N] output) that finds one box (cx,cy,w,h in input px) everywhere.

    A stride-8 convolution with zero weights and the box and class scores as biases: every one of the
    (size/8)^2 anchors says the same thing, NMS keeps one. Real ONNX, real ONNX Runtime, known answer.
    """
    channels = 4 + len(scores)
    cells = (size // 8) ** 2
    n: int | str = "batch" if dynamic_batch else 1
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [n, 3, size, size])
    y = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [n, channels, cells])
    w = helper.make_tensor("w", TensorProto.FLOAT, [channels, 3, 8, 8], np.zeros(channels * 3 * 64, np.float32))
    b = helper.make_tensor("b", TensorProto.FLOAT, [channels], np.array([*box, *scores], np.float32))
    lead = -1 if dynamic_batch else 1
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], np.array([lead, channels, cells], np.int64))
    nodes = [
        helper.make_node("Conv", ["images", "w", "b"], ["c"], kernel_shape=[8, 8], strides=[8, 8]),
        helper.make_node("Reshape", ["c", "shape"], ["output0"]),
    ]
    graph = helper.make_graph(nodes, "tiny_detector", [x], [y], [w, b, shape])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def no_decoder_model(path: Path, size: int = 32) -> Path:
    """An image model whose output ([1, N] features) fits no detection decoder."""
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])
    y = helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 3 * size * size])
    graph = helper.make_graph([helper.make_node("Flatten", ["images"], ["features"])], "features", [x], [y])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


class VanishingCamera(FrameSource):
    """A real source whose device disappears for good after ``n`` frames."""

    def __init__(self, n: int) -> None:
        super().__init__("vanishing://")
        self.n = n

    def open(self) -> None:
        self.width, self.height, self._opened = 96, 64, True

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        if self.n == 0:
            raise SourceError("vanishing://: device removed")
        self.n -= 1
        return np.zeros((64, 96, 3), np.uint8) if out is None else out

    def close(self) -> None:
        self._opened = False
