"""edgert's ByteTrack gives the same ids under numpy 1 as under numpy 2 (JetPack's numpy is 1.x).

Needs a second interpreter with ``numpy<2`` and edgert's ``[track]``: ``EDGERT_NP1_PYTHON`` (default
/tmp/deps-np1/bin/python, made with ``python3 -m venv /tmp/deps-np1 && /tmp/deps-np1/bin/pip install -e
'.[track]' 'numpy<2'``); skips without it. The whole-video check (docs/results/README.md)
(docs/results/compare_trackers.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

NP1 = Path(os.environ.get("EDGERT_NP1_PYTHON", "/tmp/deps-np1/bin/python"))

_SCENE = r"""
import json, numpy as np
from edgert.analytics.bytetrack import ByteTrack
rng = np.random.default_rng(3)
t = ByteTrack(frame_rate=10.0, track_activation_threshold=0.5, minimum_consecutive_frames=1,
              high_conf_det_threshold=0.5)
out = []
for f in range(120):
    boxes, conf = [], []
    for k in range(6):  # six walkers on crossing paths, one in four detections weak, some frames missed
        if (f + k) % 17 == 0:
            continue
        x = 40 + k * 90 + (5 - 2 * k) * f * 0.8
        y = 100 + 30 * (k % 3) + f * (0.5 if k % 2 else -0.3)
        boxes.append([x, y, x + 40, y + 90] + rng.normal(0, 1.0, 4))
        conf.append(0.35 if (f * 7 + k) % 4 == 0 else 0.85)
    ids = t.update(np.array(boxes, np.float32).reshape(-1, 4), np.array(conf, np.float32), f / 10.0)
    out.append(ids.tolist())
print(json.dumps({"numpy": np.__version__, "ids": out}))
"""


def _ids(python: str) -> dict[str, object]:
    proc = subprocess.run([python, "-c", _SCENE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-1500:]
    result: dict[str, object] = json.loads(proc.stdout)
    return result


@pytest.mark.skipif(not NP1.exists(), reason=f"no numpy-1 interpreter at {NP1} (EDGERT_NP1_PYTHON)")
def test_same_ids_under_numpy_1_and_2() -> None:
    one, two = _ids(str(NP1)), _ids(sys.executable)
    assert str(one["numpy"]).startswith("1.") and not str(two["numpy"]).startswith("1.")
    assert one["ids"] == two["ids"]
    assert len({i for frame in two["ids"] for i in frame if i >= 0}) >= 6  # type: ignore[attr-defined]
