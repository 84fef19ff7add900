"""A batch's candidates finished in one go (``DecoderBase._finish_batch``: one NMS, one mapping to every frame)
give each frame the same detections, to the bit, as that frame alone: its own NMS and
``LetterboxTransform.to_original`` on its own boxes (the per-frame definition)."""

from __future__ import annotations

import numpy as np
import pytest

from edgert.config import DecodeConfig
from edgert.types import TensorSpec
from edgert.vision.decoders import make_decoder
from edgert.vision.nms import nms_batched
from edgert.vision.preprocess import LetterboxTransform


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_finish_equals_each_frame_alone(dtype: type) -> None:
    decoder = make_decoder(DecodeConfig(conf=0.25, max_det=7), [TensorSpec("output0", (1, 84, 2100),
                                                                            np.dtype(np.float32))], {})
    rng = np.random.default_rng(3)
    frames = 6
    sizes = [40, 0, 13, 1, 90, 25]  # one frame with no candidate, one with more than max_det kept
    transforms = [LetterboxTransform(0.41 + 0.07 * k, 0.43 + 0.05 * k, 3.5 * k, 7.25, 640 + 16 * k, 480 - 8 * k)
                  for k in range(frames)]
    per_frame = []
    for n in sizes:
        xy = rng.uniform(-20, 420, (n, 2))
        wh = rng.uniform(4, 120, (n, 2))
        per_frame.append((np.concatenate([xy, xy + wh], axis=1).astype(dtype), rng.uniform(0.25, 1, n).astype(
            np.float32), rng.integers(0, 3, n).astype(np.int32)))
    xyxy = np.concatenate([b for b, _, _ in per_frame])
    conf = np.concatenate([c for _, c, _ in per_frame])
    cls = np.concatenate([k for _, _, k in per_frame])
    sample = np.repeat(np.arange(frames), sizes)
    got = decoder._finish_batch(xyxy.copy(), conf, cls, sample, transforms)
    assert len(got) == frames
    for k, (boxes, scores, classes) in enumerate(per_frame):
        keep = nms_batched(boxes, scores, decoder.config.iou, classes, np.zeros(boxes.shape[0], np.int64), 80,
                           decoder.config.max_det)
        want = boxes[keep].copy()
        transforms[k].to_original(want)
        d = got[k]
        assert d.xyxy.dtype == np.float32 and d.confidence.dtype == np.float32 and d.class_id.dtype == np.int32
        assert np.array_equal(d.xyxy, want.astype(np.float32))
        assert np.array_equal(d.confidence, scores[keep]) and np.array_equal(d.class_id, classes[keep])
        assert d.names == decoder.names and d.track_id is None
    assert len(got[1]) == 0 and len(got[4]) == 7
