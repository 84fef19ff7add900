"""The rules people configure, on hand-made tracks: --line/--zone syntax, one-way lines, crowded zones, and
every bad rule as one line (NaN, off the frame, an unknown class, a bad direction), in flags and in YAML."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgert.analytics import Analytics
from edgert.analytics.rules import parse_line, parse_zone
from edgert.analytics.table import resolve_rules, with_rules
from edgert.config import AnalyticsConfig, LineConfig, PipelineConfig, ZoneConfig, load_config
from edgert.errors import ConfigError
from edgert.vision.detections import Detections

NAMES = ("person", "car")


def _frame(*objects: tuple[int, float, float]) -> Detections:
    """Person boxes 20x40 whose bottom centre is at (x, y), for (track_id, x, y)."""
    if not objects:
        return Detections.empty(NAMES).with_track_id(np.zeros(0, np.int64))
    boxes = [[x - 10, y - 40, x + 10, y] for _, x, y in objects]
    return Detections(np.array(boxes), np.full(len(objects), 0.9), np.zeros(len(objects)), NAMES,
                      track_id=[o[0] for o in objects])


def test_line_flag_with_direction_classes_and_fractions() -> None:
    line = parse_line("door:0.5,0,0.5,1:in:classes=person,2")
    assert line == LineConfig(name="door", points=((0.5, 0.0), (0.5, 1.0)), direction="in", classes=("person", "2"))
    assert parse_line("door:10,20,30,40").direction == "both"
    zone = parse_zone("hall:0,0,1,0,1,1:crowded_at=3")
    assert zone.polygon == ((0, 0), (1, 0), (1, 1)) and zone.crowded_at == 3 and zone.classes is None
    # 0..1 coordinates are fractions of each source's frame; pixels stay pixels
    resolved = resolve_rules(AnalyticsConfig(lines=(line,), zones=(zone,)), 640, 480, ("person",) * 3)
    assert resolved.lines[0].points == ((320.0, 0.0), (320.0, 480.0))
    assert resolved.zones[0].polygon == ((0.0, 0.0), (640.0, 0.0), (640.0, 480.0))
    pixels = resolve_rules(AnalyticsConfig(lines=(parse_line("a:10,20,300,40"),)), 640, 480)
    assert pixels.lines[0].points == ((10.0, 20.0), (300.0, 40.0))


@pytest.mark.parametrize("flag, needles", [
    ("door:nan,0,0.5,1", ("--line door", "finite")),
    ("door:0.5,inf,0.5,1", ("--line door", "finite")),
    ("door:0.5,0,0.5,1:sideways", ("--line door", "unknown option 'sideways'", "in, out")),
    ("door:0,0,1,1,2,2", ("--line door", "4 coordinates")),
    ("door:0.5,0,0.5", ("--line door", "3 coordinates", "x,y pairs")),
    ("door:0.5,0,0.5,x", ("--line door", "'x' is not a number")),
    ("door:1,1,1,1", ("--line door", "the same")),
    ("door", ("--line 'door'", "NAME:x1,y1,x2,y2")),
    ("door:0,0,1,1:classes=", ("--line door", "no class")),
])
def test_bad_line_flags_are_one_line(flag: str, needles: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_line(flag)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("flag, needles", [
    ("hall:0,0,1,0", ("--zone hall", "at least 3 points")),
    ("hall:0,0,1,0,nan,1", ("--zone hall", "finite")),
    ("hall:0,0,1,0,1,1:crowded_at=0", ("--zone hall", "crowded_at", ">= 1")),
    ("hall:0,0,1,0,1,1:crowded_at=lots", ("--zone hall", "crowded_at", "whole number")),
    ("hall:0,0,1,0,1,1:in", ("--zone hall", "unknown option 'in'")),
])
def test_bad_zone_flags_are_one_line(flag: str, needles: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_zone(flag)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_rules_checked_against_the_frame_and_the_model() -> None:
    off = AnalyticsConfig(lines=(parse_line("door:320,0,700,480"),))
    with pytest.raises(ConfigError, match=r"line door: point \(700, 480\) is off the 640x480 frame of source cam"):
        resolve_rules(off, 640, 480, NAMES, "cam")
    negative = AnalyticsConfig(zones=(parse_zone("hall:-5,0,100,0,100,100"),))
    with pytest.raises(ConfigError, match=r"zone hall: point \(-5, 0\) is off"):
        resolve_rules(negative, 640, 480, NAMES)
    unknown = AnalyticsConfig(lines=(parse_line("door:0,0,1,1:classes=persn"),))
    with pytest.raises(ConfigError, match=r"line door: unknown class 'persn'\. Note: the model's classes are person"):
        resolve_rules(unknown, 640, 480, NAMES)
    with pytest.raises(ConfigError, match="unknown class '7'"):  # an id past the model's table
        resolve_rules(AnalyticsConfig(lines=(parse_line("door:0,0,1,1:classes=7"),)), 640, 480, NAMES)
    assert resolve_rules(AnalyticsConfig(lines=(parse_line("door:0,0,1,1:classes=1"),)), 640, 480, NAMES)
    with pytest.raises(ConfigError, match="need the frame size"):
        resolve_rules(AnalyticsConfig(lines=(parse_line("door:0,0,1,1"),)), 0, 0, NAMES, "odd")
    with pytest.raises(ConfigError, match="used twice: door"):  # a flag's name clashing with the config's
        with_rules(off, "--line", ["door:0,0,1,1"])


def test_bad_rules_in_yaml_are_one_line_with_their_line(tmp_path: Path) -> None:
    cases = {
        "direction: sideways": "analytics.lines.0.direction: expected one of in, out, both",
        "points: [[.nan, 0], [10, 10]]": "analytics.lines.0.points: coordinates must be finite numbers",
    }
    for body, needle in cases.items():
        cfg = tmp_path / "bad.yaml"
        extra = "" if body.startswith("points") else "points: [[0, 0], [10, 10]], "
        cfg.write_text(f"analytics:\n  lines:\n    - {{name: door, {extra}{body}}}\n")
        with pytest.raises(ConfigError) as err:
            load_config(cfg)
        assert needle in str(err.value) and str(err.value).startswith(f"{cfg}:") and "\n" not in str(err.value)
    cfg.write_text("analytics:\n  zones:\n    - {name: hall, polygon: [[0, 0], [9, 0], [9, 9]], crowded_at: 0}\n")
    with pytest.raises(ConfigError, match=r"analytics\.zones\.0\.crowded_at: expected a number of tracks >= 1"):
        load_config(cfg)
    cfg.write_text("analytics:\n  lines:\n    - {name: door, points: [[0, 0], [10, 10]], direction: in,"
                   " classes: [person]}\n  zones:\n    - {name: hall, polygon: [[0, 0], [9, 0], [9, 9]],"
                   " crowded_at: 2}\n")
    config = load_config(cfg)
    assert isinstance(config, PipelineConfig)
    assert config.analytics.lines[0].direction == "in" and config.analytics.zones[0].crowded_at == 2


LINE_IN = LineConfig(name="door", points=((0.0, 100.0), (200.0, 100.0)), direction="in")
LINE_BOTH = LineConfig(name="both", points=((0.0, 100.0), (200.0, 100.0)))


def test_a_one_way_line_counts_only_its_direction() -> None:
    analytics = Analytics(AnalyticsConfig(lines=(LINE_IN, LINE_BOTH)))
    # track 1 walks down (right-hand side -> ... is out for a line drawn left to right), then back up (in)
    path = [(1, 50, 80), (1, 50, 120), (1, 50, 80)]
    events = []
    for i, (tid, x, y) in enumerate(path):
        events.extend(analytics.update(_frame((tid, x, y)), i, i / 10.0))
    both = [e["direction"] for e in events if e["line"] == "both"]
    one_way = [e["direction"] for e in events if e["line"] == "door"]
    assert sorted(both) == ["in", "out"] and one_way == ["in"]
    counts = analytics.counts()
    assert counts["door"] == {"person": {"in": 1}} and counts["both"] == {"person": {"in": 1, "out": 1}}


def test_a_zone_with_a_threshold_says_when_it_is_crowded_and_clear() -> None:
    zone = ZoneConfig(name="hall", polygon=((0, 0), (100, 0), (100, 100), (0, 100)), crowded_at=2)
    analytics = Analytics(AnalyticsConfig(zones=(zone,), lost_after=2))
    frames = [
        _frame((1, 50, 50)),                 # one inside
        _frame((1, 50, 50), (2, 60, 60)),    # two: crowded
        _frame((1, 50, 50), (2, 60, 60), (3, 70, 70)),  # three: still crowded, no second event
        _frame((1, 150, 50), (2, 60, 60), (3, 70, 70)),  # one left: still two
        _frame((2, 160, 60), (3, 70, 70)),   # down to one: clear
        _frame((2, 160, 60), (3, 70, 70), (4, 20, 20)),  # two again: crowded again
    ]
    kinds = []
    for i, det in enumerate(frames):
        for e in analytics.update(det, i, i / 10.0):
            if e["type"] in ("zone_crowded", "zone_clear"):
                kinds.append((e["type"], e["frame"], e["occupancy"]))
                assert e["zone"] == "hall" and e["crowded_at"] == 2
    assert kinds == [("zone_crowded", 1, 2), ("zone_clear", 4, 1), ("zone_crowded", 5, 2)]
    # a track lost (unseen for lost_after frames) leaves, and the zone clears with it
    events = []
    for i in range(6, 10):
        events.extend(analytics.update(_frame((3, 70, 70)), i, i / 10.0))
    assert [e["type"] for e in events if e["type"].startswith("zone_c")] == ["zone_clear"]


def test_rules_flags_on_a_speech_task_are_refused_in_one_line(tmp_path: Path) -> None:
    from tests.helpers import assert_one_line_error, run_cli

    r = run_cli("run", "--task", "vad", "--source", str(tmp_path / "a.wav"), "--model", str(tmp_path / "m.onnx"),
                "--zone", "hall:0,0,1,0,1,1", timeout=60)
    assert_one_line_error(r, "--zone", "detection only")
