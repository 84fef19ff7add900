"""Counting lines and zones on hand-made tracks: where a crossing counts, which way, dwell, loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgert.analytics import Analytics, ZoneMonitor
from edgert.analytics.geometry import anchor_points, points_in_polygon, side_of_line
from edgert.config import AnalyticsConfig, LineConfig, PipelineConfig, ZoneConfig, load_config
from edgert.errors import ConfigError, InputError
from edgert.vision.detections import Detections

NAMES = ("person", "car")


def _frame(*objects: tuple[int, float, float, int]) -> Detections:
    """Boxes 20x40 whose bottom centre is at (x, y), for (track_id, x, y, class_id)."""
    if not objects:
        return Detections.empty(NAMES).with_track_id(np.zeros(0, np.int64))
    boxes = [[x - 10, y - 40, x + 10, y] for _, x, y, _ in objects]
    return Detections(np.array(boxes), np.full(len(objects), 0.9), [o[3] for o in objects], NAMES,
                      track_id=[o[0] for o in objects])


def _run(analytics: Analytics, frames: list[Detections], fps: float = 10.0) -> list[dict]:
    events = []
    for i, det in enumerate(frames):
        events.extend(analytics.update(det, i, 100.0 + i / fps))
    return events


LINE = LineConfig(name="door", points=((0.0, 100.0), (200.0, 100.0)))  # horizontal, drawn left to right


def test_geometry_basics() -> None:
    a, b = np.array([0.0, 100.0]), np.array([200.0, 100.0])
    # y grows downwards: above the line (smaller y) is the left-hand side walking from a to b
    assert side_of_line(np.array([[50, 90], [50, 110], [50, 100]]), a, b).tolist() == [-1, 1, 0]
    square = np.array([[0, 0], [10, 0], [10, 10], [0, 10]])
    assert points_in_polygon(np.array([[5, 5], [15, 5], [-1, 5], [5, 11]]), square).tolist() == [
        True, False, False, False]
    assert anchor_points(np.array([[0, 0, 10, 20]])).tolist() == [[5.0, 20.0]]
    assert anchor_points(np.array([[0, 0, 10, 20]]), "center").tolist() == [[5.0, 10.0]]


def test_line_counts_in_and_out_per_class_by_bottom_centre() -> None:
    analytics = Analytics(AnalyticsConfig(lines=(LINE,)))
    frames = [_frame((1, 50, 130 - 10 * i, 0), (2, 150, 70 + 10 * i, 1)) for i in range(7)]
    events = _run(analytics, frames)
    assert [(e["track_id"], e["class"], e["direction"]) for e in events] == [(1, "person", "in"), (2, "car", "out")]
    first = events[0]
    # y 130, 120, 110, 100 (on the line: not yet), 90: counted at frame 4, when it is over
    assert first["type"] == "line_cross" and first["line"] == "door" and first["frame"] == 4
    assert first["time"] == pytest.approx(100.4)
    assert analytics.counts() == {"door": {"car": {"in": 0, "out": 1}, "person": {"in": 1, "out": 0}}}


def test_line_ignores_passing_beyond_its_ends_touching_and_untracked() -> None:
    analytics = Analytics(AnalyticsConfig(lines=(LINE,)))
    frames = [
        _frame((1, 300, 120, 0), (2, 50, 100, 0)),  # 1: right of the segment's end; 2: on the line
        _frame((1, 300, 80, 0), (2, 50, 100, 0)),  # 1 changes side beyond the end: no crossing
        _frame((1, 300, 60, 0), (2, 50, 101, 0)),  # 2 steps off the line to where it came from (nowhere)
    ]
    assert _run(analytics, frames) == []
    untracked = Detections(np.array([[40, 80, 60, 120]]), [0.9], [0], NAMES)
    with pytest.raises(InputError, match="tracked detections"):
        analytics.update(untracked, 3, 1.0)
    minus = _frame((-1, 50, 130, 0))
    assert analytics.update(minus, 4, 1.0) == []


def test_line_touch_then_cross_counts_once() -> None:
    analytics = Analytics(AnalyticsConfig(lines=(LINE,)))
    ys = [110, 100, 100, 90, 100, 90]  # down -> on the line -> over; back onto it and off the same side
    events = _run(analytics, [_frame((5, 60, y, 0)) for y in ys])
    assert [(e["frame"], e["direction"]) for e in events] == [(3, "in")]


def test_line_class_filter_and_gap_in_track() -> None:
    line = LineConfig(name="cars", points=((0.0, 100.0), (200.0, 100.0)), classes=("car",))
    analytics = Analytics(AnalyticsConfig(lines=(line,)))
    frames = [_frame((1, 50, 130, 0), (2, 150, 130, 1)), _frame(), _frame(),  # both unseen for two frames
              _frame((1, 50, 70, 0), (2, 150, 70, 1))]
    events = _run(analytics, frames)
    assert [(e["track_id"], e["class"]) for e in events] == [(2, "car")]


def test_zone_enter_exit_dwell_occupancy_and_loss() -> None:
    zone = ZoneConfig(name="bay", polygon=((0.0, 0.0), (100.0, 0.0), (100.0, 100.0), (0.0, 100.0)))
    analytics = Analytics(AnalyticsConfig(zones=(zone,), lost_after=3))
    frames = [
        _frame((1, 150, 50, 0), (2, 50, 50, 1)),  # 2 starts inside: enters at once
        _frame((1, 90, 50, 0), (2, 50, 50, 1)),  # 1 enters
        _frame((1, 80, 50, 0)),  # 2 unseen from here on
        _frame((1, 120, 50, 0)),  # 1 leaves
        _frame(), _frame(), _frame(),  # 2 is lost after 3 unseen frames (at frame 5)
    ]
    events = _run(analytics, frames)
    kinds = [(e["type"], e["track_id"], e["frame"]) for e in events]
    assert kinds == [("zone_enter", 2, 0), ("zone_enter", 1, 1), ("zone_exit", 1, 3), ("zone_exit", 2, 1)]
    leave_1, lost_2 = events[2], events[3]
    assert leave_1["reason"] == "left" and leave_1["dwell_s"] == pytest.approx(0.2)
    assert lost_2["reason"] == "lost" and lost_2["dwell_s"] == pytest.approx(0.1)  # ends when last seen
    assert analytics.counts() == {"bay": {
        "car": {"occupancy": 0, "entered": 1, "exited": 1, "dwell_s": pytest.approx(0.1)},
        "person": {"occupancy": 0, "entered": 1, "exited": 1, "dwell_s": pytest.approx(0.2)}}}


def test_zone_occupancy_holds_through_a_missed_frame() -> None:
    zone = ZoneConfig(name="z", polygon=((0.0, 0.0), (100.0, 0.0), (50.0, 100.0)))
    analytics = Analytics(AnalyticsConfig(zones=(zone,)))
    _run(analytics, [_frame((1, 50, 50, 0)), _frame()])
    assert analytics.counts()["z"]["person"]["occupancy"] == 1
    monitor = analytics.rules[0]
    assert isinstance(monitor, ZoneMonitor) and set(monitor.dwell(200.0)) == {1}


@pytest.mark.parametrize(("text", "needle"), [
    ("track: {tracker: deepsort}", "track.tracker: unknown tracker 'deepsort'. Note: valid trackers are bytetrack"),
    ("track: {}\nanalytics:\n  lines:\n    - name: a\n      points: [[1, 2]]",
     ":5: analytics.lines.0.points: expected 2 points"),
    ("track: {}\nanalytics:\n  zones:\n    - name: z\n      polygon: [[1, 2], [3, 4]]",
     ":5: analytics.zones.0.polygon: expected at least 3 points"),
    ("track: {}\nanalytics:\n  lines:\n    - name: a\n      points: [[1, 2], [3]]",
     "analytics.lines.0.points.1: expected 2"),
    ("track: {}\nanalytics:\n  lines:\n    - {name: a, points: [[0, 1], [2, 3]]}\n"
     "  zones:\n    - {name: a, polygon: [[0, 0], [1, 0], [1, 1]]}", "used twice: a"),
    ("track: {lost_track_buffer: -1}", "track.lost_track_buffer: expected frames >= 0"),
])
def test_bad_config_is_one_line_with_file_and_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert needle in message and "\n" not in message and message.startswith(str(path)), message


def test_good_analytics_config(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("track: {tracker: sort, frame_rate: 25}\nanalytics:\n  lines:\n"
                    "    - {name: door, points: [[0, 288], [768, 288]], classes: [person, 2]}\n"
                    "  zones:\n    - {name: bay, polygon: [[0, 0], [10, 0], [10, 10], [0, 10]]}\n")
    cfg = load_config(path)
    assert cfg.track is not None and cfg.track.tracker == "sort" and cfg.track.frame_rate == 25.0
    assert cfg.analytics.lines[0].points == ((0.0, 288.0), (768.0, 288.0))
    assert cfg.analytics.lines[0].classes == ("person", "2") and cfg.analytics.enabled
    assert PipelineConfig().track is None and not PipelineConfig().analytics.enabled


def test_counts_as_prometheus_metrics_labelled_by_line_zone_and_class() -> None:
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is in the test extra")
    from edgert.service.metrics import render_metrics
    from edgert.stats import PipelineStats

    zone = ZoneConfig(name="bay", polygon=((0.0, 0.0), (100.0, 0.0), (100.0, 200.0), (0.0, 200.0)))
    analytics = Analytics(AnalyticsConfig(lines=(LINE,), zones=(zone,)))
    _run(analytics, [_frame((1, 50, 130 - 10 * i, 0), (2, 150, 130 - 10 * i, 1)) for i in range(6)])
    stats = PipelineStats()
    stats.analytics_counts = analytics.counts()  # type: ignore[attr-defined]  # what the pipeline sets
    fams = {f.name: f for f in parser.text_string_to_metric_families(render_metrics(stats, {}, True, 0.0))}
    crossings = {(s.labels["line"], s.labels["class"], s.labels["direction"]): s.value
                 for s in fams["edgert_line_crossings"].samples}
    assert crossings == {("door", "car", "in"): 1, ("door", "car", "out"): 0,
                         ("door", "person", "in"): 1, ("door", "person", "out"): 0}
    occupancy = {(s.labels["zone"], s.labels["class"]): s.value for s in fams["edgert_zone_occupancy"].samples}
    assert occupancy == {("bay", "person"): 1}
    assert [s.value for s in fams["edgert_zone_entries"].samples] == [1]
    plain = {f.name for f in parser.text_string_to_metric_families(render_metrics(PipelineStats(), {}, True, 0.0))}
    assert "edgert_line_crossings" not in plain


def test_lines_without_tracking_are_refused_when_the_run_starts(tmp_path: Path) -> None:
    from edgert.pipeline import Pipeline

    path = tmp_path / "p.yaml"
    path.write_text("model: m.onnx\nsource: v.avi\nanalytics:\n  lines:\n    - {name: a, points: [[0, 1], [2, 3]]}\n")
    config = load_config(path)  # a flag (--track) may still add the tracker
    with pytest.raises(ConfigError, match=r"add a track section .* or pass --track"):
        Pipeline(config, handle_signals=False).run()
