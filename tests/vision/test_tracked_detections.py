"""Track ids on Detections, analytics events through the JSONL sink and its worker, drawing lines and zones."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from edgert.config import LineConfig, ZoneConfig
from edgert.errors import InputError
from edgert.io.sinks import FrameResult, SinkWorker, StreamInfo, open_sink
from edgert.vision.detections import Detections

NAMES = ("person", "car")


def _det(track: bool = True) -> Detections:
    return Detections(np.array([[10, 10, 30, 50], [40, 10, 60, 50]]), [0.9, 0.8], [0, 1], NAMES,
                      track_id=[4, 9] if track else None)


def test_track_id_is_optional_validated_sliced_and_compared() -> None:
    plain, tracked = _det(False), _det(True)
    assert plain.track_id is None and "track_id" not in plain.to_records()[0]
    assert tracked.track_id is not None and tracked.track_id.dtype == np.int64
    assert [r["track_id"] for r in tracked.to_records()] == [4, 9]
    assert tracked[1:].track_id.tolist() == [9]  # type: ignore[union-attr]
    assert tracked != plain and tracked == plain.with_track_id([4, 9]) and tracked != plain.with_track_id([4, 8])
    with pytest.raises(InputError, match="2 boxes but 1 track ids"):
        plain.with_track_id([1])
    with pytest.raises(InputError, match="track_id"):
        plain.with_track_id(["a", "b"])


def test_jsonl_writes_events_as_their_own_records_through_the_worker(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    worker = SinkWorker(open_sink(f"jsonl://{path}"))
    worker.sink.open(StreamInfo(96, 64))
    worker.start()
    event = {"type": "zone_exit", "zone": "bay", "track_id": 4, "class": "person", "time": 1.5, "frame": 1,
             "dwell_s": 0.5, "reason": "left"}
    for i in range(3):
        assert worker.offer(FrameResult(i, 1.0 + i / 2, _det(), events=[event] if i == 1 else []))
    deadline = time.monotonic() + 5
    while worker.written < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r.get("type", "frame") for r in records] == ["frame", "frame", "zone_exit", "frame"]
    assert records[2] == event and records[1]["detections"][0]["track_id"] == 4


def test_draw_track_ids_lines_and_zones() -> None:
    pytest.importorskip("cv2")
    from edgert.analytics.table import draw_rules
    from edgert.config import AnalyticsConfig
    from edgert.vision.draw import draw_detections

    frame = np.zeros((120, 160, 3), np.uint8)
    with_id, without = frame.copy(), frame.copy()
    draw_detections(with_id, _det(True))
    draw_detections(without, _det(False))
    assert not np.array_equal(with_id, without)  # the "#4" label is drawn
    line = LineConfig(name="door", points=((0.0, 100.0), (160.0, 100.0)))
    zone = ZoneConfig(name="bay", polygon=((80.0, 20.0), (150.0, 20.0), (150.0, 90.0)))
    canvas = frame.copy()
    draw_rules(canvas, AnalyticsConfig(lines=(line,), zones=(zone,)), {"door": {"person": {"in": 3, "out": 1}}})
    assert canvas[100, 5].tolist() == [0, 255, 255]  # the line, in yellow, across the frame
    assert canvas[20:22, 100:110].any()  # the zone's top edge
    untouched = frame.copy()
    draw_rules(untouched, AnalyticsConfig(), None)
    assert not untouched.any()
