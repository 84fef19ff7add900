"""edgert's ByteTrack against its reference (Roboflow's trackers), and its assignment without SciPy.

The assignment port is checked against brute force (every permutation) and, when SciPy is there, against
SciPy on the same matrices, ties included. The tracker is checked id for id against
``trackers.ByteTrackTracker`` on synthetic scenes that exercise its two stages, crossings, occlusion gaps
and dropped frames, through the ids that library gave (saved beside this file; re-checked live where
``trackers`` is installed, which CI's test extra does not do: it brings opencv-python).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.analytics.assignment import assign_max_python
from edgert.analytics.bytetrack import ByteTrack, box_iou
from edgert.analytics.tracking import Tracker
from edgert.config import TrackConfig
from edgert.vision.detections import Detections
from tests.helpers import ROOT


def _brute(sim: np.ndarray) -> float:
    n, m = sim.shape
    if n <= m:
        return max(sum(sim[i, p[i]] for i in range(n)) for p in itertools.permutations(range(m), n))
    return _brute(sim.T)


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 5), (5, 2), (4, 6), (6, 4)])
def test_assignment_is_optimal(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    for _ in range(20):
        sim = rng.random(shape).astype(np.float32)
        sim[rng.random(shape) < 0.4] = 0.0  # sparse, as IoU between far boxes is
        rows, cols = assign_max_python(sim)
        assert len(rows) == min(shape) and len(set(cols.tolist())) == len(cols)
        assert list(rows) == sorted(rows)
        assert float(sim[rows, cols].sum()) == pytest.approx(_brute(sim.astype(np.float64)), abs=1e-6)


def test_assignment_matches_scipy_including_ties() -> None:
    optimize = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(7)
    for _ in range(200):
        shape = (int(rng.integers(1, 9)), int(rng.integers(1, 9)))
        sim = rng.integers(0, 3, shape).astype(np.float32)  # small integers: many ties
        r1, c1 = assign_max_python(sim)
        r2, c2 = optimize.linear_sum_assignment(sim, maximize=True)
        assert r1.tolist() == r2.tolist() and c1.tolist() == c2.tolist()


def test_iou_and_bad_settings() -> None:
    iou = box_iou(np.array([[0, 0, 10, 10]], np.float32), np.array([[5, 5, 15, 15], [20, 20, 30, 30]], np.float32))
    np.testing.assert_allclose(iou, [[25 / 175, 0.0]], rtol=1e-6)
    assert box_iou(np.empty((0, 4)), np.empty((3, 4))).shape == (0, 3)
    with pytest.raises(ValueError, match="frame_rate"):
        ByteTrack(frame_rate=0.0)
    with pytest.raises(ValueError, match="lost_track_buffer"):
        ByteTrack(lost_track_buffer=-1)


def _scene(frame: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Four walkers: two cross each other, one is hidden for frames 20-31, one fades to low confidence."""
    boxes, conf = [], []
    jitter = rng.normal(0, 0.8, (4, 4))
    for k, (x0, vx, y) in enumerate([(20, 5, 100), (320, -5, 104), (50, 2, 300), (400, -3, 420)]):
        if k == 2 and 20 <= frame < 32:
            continue
        x = x0 + vx * frame
        boxes.append(np.array([x, y, x + 40, y + 90], np.float64) + jitter[k])
        conf.append(0.3 + 0.01 * (frame % 7) if k == 3 and frame > 30 else 0.9 - 0.02 * k)
    return np.array(boxes, np.float32).reshape(-1, 4), np.array(conf, np.float32)


#: The ids ``trackers.ByteTrackTracker`` (2.6.1) gave on the scenes below, one list per frame. Saved so the
#: comparison runs everywhere: ``trackers`` needs opencv-python, which must not sit beside the headless wheel
#: in a test venv (both own ``cv2/``). Regenerate where it is installed:
#: ``EDGERT_SAVE_TRACKERS_REFERENCE=1 pytest tests/analytics/test_bytetrack.py -k same_ids``.
REFERENCE = Path(__file__).with_name("bytetrack_reference.json")
CASES = [(fps, step, mf) for fps, step in [(10.0, 1), (30.0, 1), (25.0, 3)] for mf in (1, 2)]  # step 3: drops


def _settings(fps: float, min_frames: int) -> dict[str, Any]:
    return dict(lost_track_buffer=30, frame_rate=fps, track_activation_threshold=0.5,
                minimum_consecutive_frames=min_frames, minimum_iou_threshold=0.1, high_conf_det_threshold=0.5)


def _reference_ids(fps: float, step: int, min_frames: int) -> list[list[int]]:
    """Ids from the real ``trackers`` library, frame by frame (needs trackers and supervision)."""
    import supervision as sv
    import trackers

    ref = trackers.ByteTrackTracker(**_settings(fps, min_frames))
    rng = np.random.default_rng(int(fps) + step)
    frames = []
    for frame in range(0, 90, step):
        boxes, conf = _scene(frame, rng)
        out = ref.update(sv.Detections(xyxy=boxes, confidence=conf, data={"i": np.arange(len(boxes))}),
                         timestamp=frame / fps)
        want = np.full(len(boxes), -1, np.int64)
        if len(out):
            want[np.asarray(out.data["i"], np.int64)] = np.asarray(out.tracker_id, np.int64)
        frames.append(want.tolist())
    return frames


def _key(fps: float, step: int, min_frames: int) -> str:
    return f"fps={fps:g} step={step} min_frames={min_frames}"


def test_saved_reference_matches_trackers_when_installed() -> None:
    pytest.importorskip("trackers", reason="trackers needs Python 3.10+, numpy 2 and opencv-python")
    pytest.importorskip("supervision")
    live = {_key(*case): _reference_ids(*case) for case in CASES}
    if os.environ.get("EDGERT_SAVE_TRACKERS_REFERENCE"):
        REFERENCE.write_text(json.dumps(live, separators=(",", ":")) + "\n")
    assert json.loads(REFERENCE.read_text()) == live


@pytest.mark.parametrize("fps,step,min_frames", CASES)
def test_same_ids_as_trackers(fps: float, step: int, min_frames: int) -> None:
    wanted = json.loads(REFERENCE.read_text())[_key(fps, step, min_frames)]
    ours = ByteTrack(**_settings(fps, min_frames))
    rng = np.random.default_rng(int(fps) + step)
    seen = set()
    for i, frame in enumerate(range(0, 90, step)):
        boxes, conf = _scene(frame, rng)
        got = ours.update(boxes, conf, frame / fps)
        assert got.tolist() == wanted[i], f"frame {frame}"
        seen.update(got[got >= 0].tolist())
    assert len(seen) >= 4


def test_bytetrack_imports_no_tracking_library() -> None:
    code = (
        "import sys, numpy as np\n"
        "from edgert.analytics.tracking import Tracker\nfrom edgert.config import TrackConfig\n"
        "from edgert.vision.detections import Detections\n"
        "t = Tracker.from_config(TrackConfig(), 10.0)\n"
        "for i in range(3):\n"
        "    t.update(Detections(np.array([[i, 0, i + 9, 9]], np.float32), np.array([0.9]), np.array([0])), i)\n"
        "print(sorted(m for m in ('trackers', 'supervision', 'cv2') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_tracker_refuses_unknown_implementation() -> None:
    with pytest.raises(ValueError, match="implementation"):
        Tracker.from_config(TrackConfig(), 10.0, implementation="other")
    tracker = Tracker.from_config(TrackConfig(), 10.0)
    empty = Detections(np.empty((0, 4), np.float32), np.empty(0, np.float32), np.empty(0, np.int64))
    assert len(tracker.update(empty, 0)) == 0


def test_the_solver_is_imported_when_the_tracker_is_made_not_on_its_first_frame() -> None:
    # SciPy's import took 0.3-1 s on the tracker's first match, holding the first frames (p99 of one stream).
    pytest.importorskip("scipy")
    code = ("import sys\n"
            "from edgert.analytics.bytetrack import ByteTrack\n"
            "assert 'scipy.optimize' not in sys.modules, 'imported with the module'\n"
            "ByteTrack()\n"
            "assert 'scipy.optimize' in sys.modules, 'not imported when the tracker is made'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
