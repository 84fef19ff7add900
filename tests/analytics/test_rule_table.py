"""Adding an analytics rule is one module and one row: a toy rule registered in the table is built from the
config, run on a real tracked video, and its counts reach the run summary's text and the metrics endpoint."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.analytics import table
from edgert.analytics.lines import counted_tracks
from edgert.analytics.rule import RuleKind, RuleMetric
from edgert.config import LineConfig
from edgert.vision.detections import Detections

MODEL = "models/detection/nanodet-m-416-coco-v8layout.onnx"


class SeenRule:
    """Counts the tracked detections of each class seen while a line is configured (a toy: no geometry)."""

    def __init__(self, config: LineConfig, lost_after: int) -> None:
        self.name = f"{config.name}-seen"
        self.config = config
        self._seen: dict[str, int] = {}

    def update(self, detections: Detections, anchors: np.ndarray, frame_index: int,
               timestamp: float) -> list[dict[str, Any]]:
        for _, _, _, name in counted_tracks(detections, self.config.classes):
            self._seen[name] = self._seen.get(name, 0) + 1
        return []

    def counts(self) -> dict[str, dict[str, Any]]:
        return {name: {"seen": n} for name, n in sorted(self._seen.items())}


def _text(counts: Mapping[str, Mapping[str, Any]]) -> str:
    return "; ".join(f"{c} seen {v['seen']} times" for c, v in counts.items())


SEEN = RuleKind("seen", "lines", "points", SeenRule, lambda figures: "seen" in figures, _text,
                lambda frame, config, counts: None,
                (RuleMetric("edgert_seen_total", "Tracked detections seen.", "counter", ("seen",)),))


def test_a_registered_rule_counts_into_the_summary_and_the_metrics(monkeypatch: pytest.MonkeyPatch,
                                                                   assets: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("scipy", reason="ByteTrack's assignment: pip install 'edgert[track]'")
    parser = pytest.importorskip("prometheus_client.parser")
    from edgert.cli.run import format_summary
    from edgert.config import PipelineConfig, from_mapping
    from edgert.pipeline import Pipeline
    from edgert.service.metrics import render_metrics

    monkeypatch.setattr(table, "RULES", [*table.RULES, SEEN])
    config = from_mapping(PipelineConfig, {
        "model": {"path": str(assets / MODEL), "backend": "onnxruntime"},
        "source": {"uri": str(assets / "video" / "vtest.avi")},
        "runtime": {"max_frames": 11},  # the metrics' counts are refreshed on frames 1, 11, 21 ...
        "track": {"tracker": "bytetrack"},
        "analytics": {"lines": [{"name": "middle", "points": [[0, 288], [768, 288]]}]},
    })
    pipeline = Pipeline(config)
    summary = pipeline.run()
    seen = summary["counts"]["middle-seen"]
    assert seen["person"]["seen"] > 0
    assert f"seen       middle-seen: {_text(seen)}" in format_summary(summary)
    text = render_metrics(pipeline.stats, {"model": "nanodet"}, True, time.time())
    family = {f.name: f for f in parser.text_string_to_metric_families(text)}["edgert_seen"]
    samples = [s for s in family.samples if s.name.endswith("_total")]
    assert {s.labels["seen"] for s in samples} == {"middle-seen"}
    assert sum(s.value for s in samples) == sum(v["seen"] for v in seen.values())
    assert "edgert_line_crossings" in {f.name for f in parser.text_string_to_metric_families(text)}
