"""A real two-source run's Prometheus text has line and zone series for each source (issue 29).

The pipeline runs NanoDet with tracking, one counting line and one zone on two different clips of vtest.avi;
its own statistics object is then rendered by the metrics endpoint's renderer and parsed with
``prometheus_client``'s parser: every source has its series, and their values equal the run's summary.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("scipy", reason="ByteTrack's assignment: pip install 'edgert[track]'")
cv2 = pytest.importorskip("cv2")
parser = pytest.importorskip("prometheus_client.parser")

MODEL = "models/detection/nanodet-m-416-coco-v8layout.onnx"


def _clip(assets: Path, out: Path, start: int, frames: int) -> Path:
    cap = cv2.VideoCapture(str(assets / "video" / "vtest.avi"))
    cap.set(cv2.CAP_PROP_POS_FRAMES, start)
    writer = None
    for _ in range(frames):
        ok, frame = cap.read()
        if not ok:
            break
        if writer is None:
            writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"MJPG"), 10.0,
                                     (frame.shape[1], frame.shape[0]))
        writer.write(frame)
    assert writer is not None
    writer.release()
    cap.release()
    return out


def test_a_two_source_run_has_line_and_zone_series_for_both(assets: Path, tmp_path: Path) -> None:
    from edgert.config import PipelineConfig, from_mapping
    from edgert.pipeline import Pipeline
    from edgert.service.metrics import render_metrics

    a = _clip(assets, tmp_path / "a.avi", 0, 60)
    b = _clip(assets, tmp_path / "b.avi", 300, 60)
    config = from_mapping(PipelineConfig, {
        "model": {"path": str(assets / MODEL), "backend": "onnxruntime"},
        "sources": [{"uri": str(a), "name": "door"}, {"uri": str(b), "name": "hall"}],
        "track": {"tracker": "bytetrack", "frame_rate": 10},
        "analytics": {"lines": [{"name": "middle", "points": [[0, 288], [768, 288]]}],
                      "zones": [{"name": "left", "polygon": [[0, 0], [384, 0], [384, 576], [0, 576]]}]},
    })
    pipeline = Pipeline(config)
    summary = pipeline.run()
    text = render_metrics(pipeline.stats, {"model": "nanodet"}, True, time.time())
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}

    entries = families["edgert_zone_entries"]  # a counter: the parser names the family without _total
    crossings = families["edgert_line_crossings"]
    for name in ("door", "hall"):
        mine = [s for s in entries.samples if s.labels.get("source") == name and s.name.endswith("_total")]
        assert mine, f"no zone series for source {name}"
        counts = summary["counts"][name]
        assert sum(s.value for s in mine) == sum(c["entered"] for c in counts["left"].values())
        lines = [s for s in crossings.samples if s.labels.get("source") == name and s.name.endswith("_total")]
        expected = sum(c["in"] + c["out"] for c in counts["middle"].values())
        assert sum(s.value for s in lines) == expected
        assert lines or expected == 0
    assert sum(c["entered"] for n in ("door", "hall") for c in summary["counts"][n]["left"].values()) > 0
