"""The issue's checks on the real vtest.avi (people walking) with NanoDet, through the real CLI.

- ``--line door:0.5,0,0.5,1:in`` counts one direction only; a zone with ``crowded_at`` says crowded / clear;
- one time base: a file played faster than real time dwells in video time (N frames: N / fps seconds);
- two sources: the summary's ``counts`` (keyed by source) match the JSONL events of each source;
- every bad rule is one line, and a run refused for one leaves its outputs alone.
Skips without the assets or the trackers package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import assert_one_line_error, run_cli
from tests.pipeline.media import cut_clip

pytest.importorskip("trackers", reason="tracking needs pip install 'edgert[track]' (Python 3.10+)")
pytest.importorskip("onnxruntime")
cv2 = pytest.importorskip("cv2")

MODEL = "models/detection/nanodet-m-416-coco-v8layout.onnx"
TIMEOUT = 600


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def one_way_run(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("rules")
    events = root / "e.jsonl"
    r = run_cli("run", "--model", str(assets / MODEL), "--source", str(assets / "video/vtest.avi"), "--track",
                "--line", "door:0.5,0,0.5,1:in", "--line", "both:0.5,0,0.5,1",
                "--zone", "lower:0,0.5,1,0.5,1,1,0,1:crowded_at=3", "--max-frames", "200",
                "--sink", f"jsonl://{events}", "--json", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout), _records(events)


def test_a_one_way_line_on_vtest_counts_only_in(one_way_run: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    summary, records = one_way_run
    crossings = [r for r in records if r.get("type") == "line_cross"]
    door = [c for c in crossings if c["line"] == "door"]
    both = [c for c in crossings if c["line"] == "both"]
    assert door and {c["direction"] for c in door} == {"in"}
    assert {c["direction"] for c in both} == {"in", "out"}  # people walk both ways across the middle
    # the one-way line saw exactly the "in" crossings of the two-way line at the same place, no "out"
    assert [(c["track_id"], c["frame"]) for c in door] == [(c["track_id"], c["frame"]) for c in both
                                                           if c["direction"] == "in"]
    counts = summary["counts"]
    assert all(set(per_class) == {"in"} for per_class in counts["door"].values())
    assert sum(v["in"] for v in counts["door"].values()) == len(door)


def test_a_crowded_zone_on_vtest_says_crowded_then_clear(
        one_way_run: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    _, records = one_way_run
    changes = [r for r in records if r.get("type") in ("zone_crowded", "zone_clear")]
    assert changes and changes[0]["type"] == "zone_crowded"
    assert all(a["type"] != b["type"] for a, b in zip(changes, changes[1:]))  # they alternate
    assert all(c["occupancy"] >= 3 if c["type"] == "zone_crowded" else c["occupancy"] < 3 for c in changes)
    # the occupancy they report is the zone's own count: enters minus exits up to that frame
    inside = 0
    for r in records:
        if r.get("type") == "zone_enter":
            inside += 1
        elif r.get("type") == "zone_exit":
            inside -= 1
        elif r.get("type") in ("zone_crowded", "zone_clear"):
            assert r["occupancy"] == inside


def test_dwell_is_video_time_when_a_file_plays_faster_than_real_time(assets: Path, tmp_path: Path) -> None:
    fps = 1.0  # nominal: 120 frames are two minutes of video, decoded and detected in far less
    video = cut_clip(assets / "video/vtest.avi", tmp_path / "slow.avi", 0, 120, fps)
    events = tmp_path / "e.jsonl"
    r = run_cli("run", "--model", str(assets / MODEL), "--source", str(video), "--track",
                "--zone", "lower:0,0.5,1,0.5,1,1,0,1", "--sink", f"jsonl://{events}", "--json", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["frames"] == 120 and summary["time_base"] == "media"
    assert summary["wall_s"] < 120 / fps  # the premise: faster than real time
    records = _records(events)
    analytics = [e for e in records if "type" in e]
    assert all(abs(e["time"] - e["frame"] / fps) < 1e-3 for e in analytics)  # every event in video time
    # frames each track's anchor (bottom centre) was seen inside the lower half, from the detections
    inside: dict[int, list[int]] = {}
    height = 576
    for frame in (r for r in records if "detections" in r):
        for d in frame["detections"]:
            if d["box"][3] > height / 2:
                inside.setdefault(d["track_id"], []).append(frame["frame"])
    checked = 0
    for exit_ in (e for e in analytics if e["type"] == "zone_exit" and e["reason"] == "left"):
        enter = [e for e in analytics if e["type"] == "zone_enter" and e["track_id"] == exit_["track_id"]
                 and e["frame"] < exit_["frame"]][-1]
        seen = [f for f in inside[exit_["track_id"]] if enter["frame"] <= f < exit_["frame"]]
        assert seen and seen[0] == enter["frame"]  # it entered where the detections first put it inside
        n = exit_["frame"] - enter["frame"]  # frames from entering to leaving
        assert abs(exit_["dwell_s"] - n / fps) <= 1.0 / fps + 1e-6
        if seen[-1] == exit_["frame"] - 1:  # seen inside up to the frame before it left: N frames inside
            assert abs(exit_["dwell_s"] - (seen[-1] - seen[0] + 1) / fps) <= 1.0 / fps + 1e-6
            checked += 1
    assert checked >= 3
    dwell = sum(c["dwell_s"] for c in summary["counts"]["lower"].values())
    assert dwell > summary["wall_s"]  # wall-clock dwell could never exceed the run's own length


def test_two_sources_counts_match_their_events(assets: Path, tmp_path: Path) -> None:
    a = cut_clip(assets / "video/vtest.avi", tmp_path / "a.avi", 0, 100, 10.0)
    b = cut_clip(assets / "video/vtest.avi", tmp_path / "b.avi", 300, 100, 10.0)
    events = tmp_path / "e.jsonl"
    r = run_cli("run", "--model", str(assets / MODEL), "--source", str(a), "--source", str(b), "--track",
                "--line", "middle:0,0.5,1,0.5", "--zone", "left:0,0,0.5,0,0.5,1,0,1", "--sink", f"jsonl://{events}",
                "--json", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    records = _records(events)
    names = [s["name"] for s in summary["sources"]]
    assert sorted(summary["counts"]) == sorted(names) == ["0", "1"]
    for name in names:
        mine = [e for e in records if e.get("source") == name and "type" in e]
        counts = summary["counts"][name]
        line: dict[str, dict[str, int]] = {}
        for e in (e for e in mine if e["type"] == "line_cross"):
            line.setdefault(e["class"], {"in": 0, "out": 0})[e["direction"]] += 1
        assert counts["middle"] == line
        entered: dict[str, int] = {}
        exited: dict[str, int] = {}
        for e in mine:
            if e["type"] == "zone_enter":
                entered[e["class"]] = entered.get(e["class"], 0) + 1
            elif e["type"] == "zone_exit":
                exited[e["class"]] = exited.get(e["class"], 0) + 1
        assert {k: v["entered"] for k, v in counts["left"].items()} == entered
        assert {k: v["exited"] for k, v in counts["left"].items() if v["exited"]} == exited
        dwell = sum(e["dwell_s"] for e in mine if e["type"] == "zone_exit")
        assert np.isclose(sum(v["dwell_s"] for v in counts["left"].values()), dwell, atol=0.01)
        # each source's entry of the summary carries its own counts too
        assert next(s for s in summary["sources"] if s["name"] == name)["counts"] == counts
    assert sum(len(v) for v in summary["counts"]["0"]["middle"].values()) > 0
    assert summary["counts"]["0"] != summary["counts"]["1"]  # two different clips: two different tallies


@pytest.mark.parametrize("flags, needles", [
    (("--line", "door:nan,0,0.5,1"), ("--line door", "finite")),
    (("--line", "door:0.5,0,0.5,1:up"), ("--line door", "unknown option 'up'", "in, out")),
    (("--line", "door:384,0,900,576"), ("line door", "(900, 576) is off the 768x576 frame")),
    (("--zone", "hall:0,0,1,0,1,1:classes=persn"), ("zone hall", "unknown class 'persn'", "person")),
])
def test_each_bad_rule_is_one_line_and_outputs_stay(assets: Path, tmp_path: Path, flags: tuple[str, ...],
                                                    needles: tuple[str, ...]) -> None:
    out = tmp_path / "keep.jsonl"
    out.write_text("earlier run\n")
    r = run_cli("run", "--model", str(assets / MODEL), "--source", str(assets / "video/vtest.avi"), "--track",
                *flags, "--sink", f"jsonl://{out}", "--max-frames", "5", timeout=TIMEOUT)
    assert_one_line_error(r, *needles)
    assert out.read_text() == "earlier run\n"  # refused before any sink truncated its file
