"""The GPU slot's host side reads every sample's candidates at once (``GpuCandidateFilter.rows_batch``): the same
rows, in the same order, as one ``rows(k)`` per sample, and the same detections through the batch NMS.

The candidate buffer is laid out as the filter kernel leaves it (header row with the count, then the rows in any
order, as atomics leave them), filled from the documented numpy reference of the kernel (``emulate_filter``).
No GPU: the buffer is host memory here, as it is (mapped) on Jetson.
"""

from __future__ import annotations

import numpy as np

from edgert.config import DecodeConfig
from edgert.types import TensorSpec
from edgert.vision.decoders import make_decoder
from edgert.vision.gpu_decode import (
    CAND_COLS,
    HEADER_ROWS,
    GpuCandidateFilter,
    candidates_to_detections_batch,
    emulate_filter,
    finish_candidates,
)
from edgert.vision.preprocess import LetterboxTransform


def _filter_with(samples: list[np.ndarray], capacity: int) -> GpuCandidateFilter:
    """A filter whose host buffer holds ``samples`` as the kernel writes them (no device: built without one)."""
    f = GpuCandidateFilter.__new__(GpuCandidateFilter)
    f.capacity, f.overflows, f.conf = capacity, 0, np.float32(0.25)
    f._region = HEADER_ROWS + capacity
    f.host = np.zeros((len(samples) * f._region, CAND_COLS), np.float32)
    rng = np.random.default_rng(5)
    for k, rows in enumerate(samples):
        base = k * f._region
        f.host[base].view(np.int32)[0] = rows.shape[0]
        kept = rows[rng.permutation(rows.shape[0])][:capacity]  # any order, as atomics leave them
        f.host[base + HEADER_ROWS: base + HEADER_ROWS + kept.shape[0]] = kept
    return f


def test_rows_batch_gives_every_sample_its_rows_and_the_same_detections() -> None:
    decoder = make_decoder(DecodeConfig(conf=0.25), [TensorSpec("output0", (1, 84, 2100), np.dtype(np.float32))], {})
    rng = np.random.default_rng(1)
    outputs = []
    for k in range(5):
        out = np.zeros((1, 84, 2100), np.float32)
        out[0, :4] = rng.uniform(5, 400, (4, 2100))
        out[0, 4:] = rng.uniform(0, 0.3 + 0.1 * k, (80, 2100))
        outputs.append(out)
    outputs[2][0, 4:] = 0.0  # a frame with no candidate
    samples = [emulate_filter(o, "yolov8", 0.25) for o in outputs]
    capacity = max(s.shape[0] for k, s in enumerate(samples) if k != 4)
    samples[4] = np.concatenate([samples[4]] * 3)  # more than the capacity: overflows
    assert samples[4].shape[0] > capacity
    transforms = [LetterboxTransform(0.5 + 0.1 * k, 0.5 + 0.1 * k, 3.0, 7.0, 640, 480) for k in range(5)]

    f = _filter_with(samples, capacity)
    rows, owner, overflowed = f.rows_batch(5)
    assert overflowed.tolist() == [False, False, False, False, True] and f.overflows == 1
    one_by_one = [f.rows(k) for k in range(4)]
    assert all(r is not None for r in one_by_one)
    for k in range(4):
        mine = rows[owner == k]
        theirs = one_by_one[k]
        assert theirs is not None
        np.testing.assert_array_equal(mine, theirs[np.argsort(theirs[:, 6], kind="stable")])
    got = finish_candidates(rows, owner, decoder, transforms[:4])
    want = candidates_to_detections_batch([r for r in one_by_one if r is not None], decoder, transforms[:4])
    assert len(got) == len(want) == 4 and len(got[2]) == 0
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.xyxy, b.xyxy)
        np.testing.assert_array_equal(a.class_id, b.class_id)
        np.testing.assert_array_equal(a.confidence, b.confidence)
    assert sum(len(d) for d in got) > 0
