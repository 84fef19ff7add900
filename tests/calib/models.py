"""Tiny real ONNX models for the calibration tests, built with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _w(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def tiny_detector(path: Path, size: int = 32, classes: int = 3, seed: int = 0, neg_inf_pad: bool = False,
                  residual: bool = False, constant_stride: bool = False) -> Path:
    """A YOLOv8-layout detector: images [1,3,S,S] -> output0 [1, 4+C, (S/4)^2].

    conv(stride 2) -> relu -> [Pad(-inf) -> MaxPool] -> conv(stride 2) -> relu [-> conv + residual Add]
    -> head conv (4+C channels) -> reshape -> decoding tail (sigmoid scores, box = relu * 8 + grid).
    ``constant_stride``: the 8 is ``Reciprocal(Constant 0.125)``, as yolov3-tiny's decoding computes its scale
    """
    rng = np.random.default_rng(seed)
    c1, c2, n = 8, 16, (size // 4) ** 2
    inits = [
        _w(rng, "w1", c1, 3, 3, 3), _w(rng, "b1", c1, scale=0.1),
        _w(rng, "w2", c2, c1, 3, 3), _w(rng, "b2", c2, scale=0.1),
        _w(rng, "wh", 4 + classes, c2, 1, 1), _w(rng, "bh", 4 + classes, scale=0.1),
        numpy_helper.from_array(np.array([1, 4 + classes, n], np.int64), "shape"),
        numpy_helper.from_array(np.array([4, classes], np.int64), "split"),
        *([] if constant_stride else [numpy_helper.from_array(np.array(8.0, np.float32), "stride")]),
        numpy_helper.from_array(np.arange(n, dtype=np.float32).reshape(1, 1, n) % (size // 4) * 4.0, "grid"),
    ]
    nodes = [
        helper.make_node("Conv", ["images", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
    ]
    if constant_stride:
        nodes += [helper.make_node("Constant", [], ["eighth"], name="eighth",
                                   value=numpy_helper.from_array(np.array(0.125, np.float32), "eighth")),
                  helper.make_node("Reciprocal", ["eighth"], ["stride"], name="stride_reciprocal")]
    x = "r1"
    stride2 = [2, 2]
    if neg_inf_pad:
        inits += [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
                  numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf")]
        nodes += [helper.make_node("Pad", [x, "pads", "neg_inf"], ["padded"], name="pad_inf", mode="constant"),
                  helper.make_node("MaxPool", ["padded"], ["pooled"], name="pool", kernel_shape=[3, 3],
                                   strides=[1, 1])]
        x = "pooled"
    nodes += [helper.make_node("Conv", [x, "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=stride2),
              helper.make_node("Relu", ["c2"], ["r2"], name="relu2")]
    x = "r2"
    if residual:
        inits += [_w(rng, "w3", c2, c2, 3, 3), _w(rng, "b3", c2, scale=0.1)]
        nodes += [helper.make_node("Conv", [x, "w3", "b3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
                  helper.make_node("Add", ["c3", x], ["res"], name="residual_add")]
        x = "res"
    nodes += [
        helper.make_node("Conv", [x, "wh", "bh"], ["head"], name="head_conv"),
        helper.make_node("Reshape", ["head", "shape"], ["flat"], name="reshape"),
        helper.make_node("Split", ["flat", "split"], ["box_raw", "cls_raw"], name="split", axis=1),
        helper.make_node("Relu", ["box_raw"], ["box_pos"], name="box_relu"),
        helper.make_node("Mul", ["box_pos", "stride"], ["box_scaled"], name="box_mul"),
        helper.make_node("Add", ["box_scaled", "grid"], ["box"], name="box_add"),
        helper.make_node("Sigmoid", ["cls_raw"], ["cls"], name="cls_sigmoid"),
        helper.make_node("Concat", ["box", "cls"], ["output0"], name="concat", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + classes, n])], inits,
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def tiny_gemm(path: Path, trans_b: int = 1, seed: int = 0) -> Path:
    """An MLP without convolutions: x [1,48] -> Gemm(transB) -> Relu -> MatMul -> Sigmoid (tail) -> y."""
    rng = np.random.default_rng(seed)
    k, n = 48, 5
    wb = (rng.standard_normal((n, k) if trans_b else (k, n)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(wb, "wg"), _w(rng, "bg", n), _w(rng, "wm", n, 2)]
    nodes = [
        helper.make_node("Gemm", ["x", "wg", "bg"], ["g"], name="gemm", transB=trans_b),
        helper.make_node("Relu", ["g"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "wm"], ["m"], name="matmul"),
        helper.make_node("Sigmoid", ["m"], ["y"], name="tail_sigmoid"),
    ]
    graph = helper.make_graph(nodes, "tiny_gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], inits)
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def write_images(folder: Path, count: int, size: tuple[int, int] = (48, 64), seed: int = 0) -> list[Path]:
    """Real PNG/JPEG files of random content."""
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        img = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        p = folder / (f"img{i:03d}.png" if i % 2 else f"img{i:03d}.jpg")
        cv2.imwrite(str(p), img)
        paths.append(p)
    return paths
