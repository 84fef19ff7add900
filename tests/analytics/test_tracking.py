"""Tracking (edgert's ByteTrack; SORT through the real ``trackers`` library): ids on synthetic motion, and the issue's
check on vtest.avi."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgert.analytics import Analytics, Tracker, make_result_stages, run_stages, stages_summary
from edgert.config import AnalyticsConfig, DecodeConfig, LineConfig, PipelineConfig, TrackConfig
from edgert.io.sinks import FrameResult, JsonlSink, StreamInfo
from edgert.vision.detections import Detections

try:
    import trackers  # noqa: F401
    HAVE_TRACKERS = True
except ImportError:  # Python < 3.10 or numpy 1: SORT is skipped, ByteTrack (edgert's) still runs
    HAVE_TRACKERS = False
needs_trackers = pytest.mark.skipif(not HAVE_TRACKERS, reason="trackers is not installed (Python 3.10+, numpy 2)")

NAMES = ("person", "car")


def _walkers(frame: int) -> Detections:
    """Two boxes moving in opposite directions, and a faint one that no track should claim."""
    a = [10 + 4 * frame, 50, 40 + 4 * frame, 110]
    b = [300 - 4 * frame, 60, 330 - 4 * frame, 120]
    faint = [200, 200, 210, 210]
    return Detections(np.array([a, faint, b], np.float32), np.array([0.9, 0.2, 0.85]), np.array([0, 0, 1]), NAMES)


@pytest.mark.parametrize("name", ["bytetrack", pytest.param("sort", marks=needs_trackers)])
def test_ids_follow_objects_in_input_order(name: str) -> None:
    tracker = Tracker.from_config(TrackConfig(tracker=name), fps=10.0)
    ids = []
    # a new object gets its id from its second frame on (the first only starts a tentative track)
    assert len(tracker.update(_walkers(0), 0)) == 0
    for i in range(1, 20):
        out = tracker.update(_walkers(i), i, 1000.0 + i)
        assert len(out) == 2 and out.track_id is not None
        assert out.class_id.tolist() == [0, 1]  # input order kept, the faint box left out
        np.testing.assert_allclose(out.xyxy, _walkers(i).xyxy[[0, 2]])
        ids.append(tuple(out.track_id.tolist()))
    assert len(set(ids)) == 1 and len(set(ids[0])) == 2  # one id per object for the whole run
    # 19 frames seen, media time 1001..1019 s: each track's age is 18 s of the times it was given
    assert tracker.summary() == {"tracker": name, "tracks": 2, "mean_track_frames": 19.0, "mean_track_s": 18.0}


def test_keep_untracked_marks_them_minus_one_and_a_restart_resets() -> None:
    tracker = Tracker.from_config(TrackConfig(keep_untracked=True))
    out = None
    for i in range(3):
        out = tracker.update(_walkers(i), i)
    assert out is not None and out.track_id is not None
    assert len(out) == 3 and out.track_id[1] == -1 and (out.track_id[[0, 2]] >= 0).all()
    assert out.to_records()[1]["track_id"] == -1
    tracker.update(_walkers(0), 0)  # frame 0 again: a looped video starts the tracks afresh
    again = tracker.update(_walkers(1), 1)
    assert again.track_id is not None and sorted(again.track_id[[0, 2]].tolist()) == [0, 1]


def test_result_stages_wire_tracking_then_analytics(tmp_path: Path) -> None:
    line = LineConfig(name="mid", points=((170.0, 0.0), (170.0, 400.0)))
    config = PipelineConfig(track=TrackConfig(), analytics=AnalyticsConfig(lines=(line,)))
    stages = make_result_stages(config, fps=10.0)
    assert [s.name for s in stages] == ["track", "analytics"]
    assert make_result_stages(PipelineConfig()) == []
    sink = JsonlSink("jsonl://x", str(tmp_path / "e.jsonl"))
    sink.open(StreamInfo(400, 300))
    events_seen = []
    for i in range(60):
        det, events = run_stages(stages, _walkers(i), i, 1000.0 + i / 10)
        events_seen.extend(events)
        sink.write(FrameResult(i, 1000.0 + i / 10, det, events=events))
    sink.close()
    assert sorted(e["direction"] for e in events_seen) == ["in", "out"]
    summary = stages_summary(stages)
    # the line points down the frame: walking it, the right-hand side is the left of the image, so the
    # person moving to the right goes in
    assert summary["counts"] == {"mid": {"car": {"in": 0, "out": 1}, "person": {"in": 1, "out": 0}}}
    records = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    crossings = [r for r in records if r.get("type") == "line_cross"]
    frames = [r for r in records if "type" not in r]
    assert len(frames) == 60 and len(crossings) == 2
    assert all("track_id" in d for r in frames for d in r["detections"])
    # each event follows its frame's record
    at = records.index(crossings[0])
    assert records[at - 1]["frame"] == crossings[0]["frame"]


def test_missing_library_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from edgert.errors import BackendUnavailable

    monkeypatch.setitem(sys.modules, "trackers", None)  # as if not installed
    with pytest.raises(BackendUnavailable, match=r"pip install trackers"):
        Tracker.from_config(TrackConfig(tracker="sort"))
    Tracker.from_config(TrackConfig())  # ByteTrack is edgert's own: no library needed


@pytest.mark.slow
def test_vtest_every_detection_tracked_long_tracks_and_crossings(assets: Path) -> None:
    """The issue's check on the real video: a counting line across the middle of the frame."""
    pytest.importorskip("onnxruntime")
    from edgert.io.sources import open_source
    from edgert.vision.detector import Detector

    config = PipelineConfig(decode=DecodeConfig(conf=0.35), track=TrackConfig())
    tracker = Tracker.from_config(TrackConfig(), fps=10.0)
    with Detector(assets / "models/detection/nanodet-m-416-coco-v8layout.onnx", config,
                  backend="onnxruntime") as detector, open_source(str(assets / "video/vtest.avi")) as source:
        middle = source.height / 2
        line = LineConfig(name="middle", points=((0.0, middle), (float(source.width), middle)))
        analytics = Analytics(AnalyticsConfig(lines=(line,)))
        events, boxes = [], 0
        for i in range(250):
            frame = source.read()
            assert frame is not None
            tracked = tracker.update(detector(frame), i, i / 10)
            assert tracked.track_id is not None and (tracked.track_id >= 0).all()
            boxes += len(tracked)
            events.extend(analytics.update(tracked, i, i / 10))
    lengths = list(tracker.lengths.values())
    assert boxes > 1000 and np.mean(lengths) >= 10, (boxes, np.mean(lengths))
    crossings = [e for e in events if e["type"] == "line_cross"]
    assert crossings and {e["class"] for e in crossings} >= {"person"}
    totals = analytics.counts()["middle"]["person"]
    assert totals["in"] + totals["out"] == sum(e["class"] == "person" for e in crossings)
