"""The host half of the GPU NMS: cutting the kernel's packed output (counts, then every sample's boxes one after
another) into one Detections per frame. Runs without a GPU; tests/gpu/test_gpu_nms.py checks the kernel itself."""

from __future__ import annotations

import numpy as np

from edgert.vision.detections import Detections
from edgert.vision.gpu_nms import split_packed

NAMES = ("a", "b", "c")


def _packed(rows: int, cap: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xyxy = np.zeros((cap, 4), np.float32)
    xyxy[:rows] = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    conf = np.zeros(cap, np.float32)
    conf[:rows] = np.linspace(0.9, 0.3, rows, dtype=np.float32)
    cls = np.zeros(cap, np.int32)
    cls[:rows] = np.arange(rows) % 3
    return xyxy, conf, cls


def test_each_sample_gets_its_own_boxes_in_order_and_overflows_are_none() -> None:
    xyxy, conf, cls = _packed(6)
    empty = Detections.empty(NAMES)
    out, overflowed = split_packed([2, 0, -1500, 3, 1], xyxy, conf, cls, NAMES, empty)
    assert overflowed == [1500]
    assert [None if d is None else len(d) for d in out] == [2, 0, None, 3, 1]
    d0, d1, d2, d3, d4 = out
    assert d0 is not None and d3 is not None and d4 is not None
    assert d1 is empty and d2 is None
    assert np.array_equal(d0.xyxy, xyxy[0:2]) and np.array_equal(d3.xyxy, xyxy[2:5])
    assert np.array_equal(d4.xyxy, xyxy[5:6])
    assert np.array_equal(d3.confidence, conf[2:5]) and np.array_equal(d4.class_id, cls[5:6])
    assert d0.names == NAMES and d0.xyxy.dtype == np.float32 and d0.class_id.dtype == np.int32
    # copies: the next batch overwrites the packed buffers, the detections must not change with them
    xyxy[:] = -1.0
    conf[:] = 0.0
    assert float(d0.xyxy.min()) >= 0.0 and float(d3.confidence.min()) > 0.0


def test_a_batch_without_boxes_gives_empties_and_the_overflowed() -> None:
    xyxy, conf, cls = _packed(0)
    empty = Detections.empty(NAMES)
    out, overflowed = split_packed([0, -2000, 0], xyxy, conf, cls, NAMES, empty)
    assert len(out) == 3 and out[0] is empty and out[1] is None and out[2] is empty and overflowed == [2000]
