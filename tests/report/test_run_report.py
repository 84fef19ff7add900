"""attach_report on a real Pipeline from Python (what ``edgert run --report`` does), and the page writes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from edgert.config import ModelConfig, PipelineConfig, PowerConfig, RuntimeConfig, SourceConfig
from edgert.errors import ReportError
from edgert.pipeline import Pipeline
from edgert.report.html import attach_report
from edgert.report.page import write_page
from tests.pipeline.media import make_video, tiny_detector

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")


def _embedded(text: str) -> dict[str, Any]:
    blob = re.search(r'<script type="application/json" id="edgert-data">(.*?)</script>', text, re.S)
    assert blob is not None
    return dict(json.loads(blob.group(1)))


def test_on_stop_writes_the_page_for_the_run(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=30, size=(96, 64))
    model = tiny_detector(tmp_path / "tiny.onnx")
    # No meter (even on a machine that has one, like the GPU device): the page then draws no watts chart.
    config = PipelineConfig(model=ModelConfig(path=str(model)), source=SourceConfig(uri=str(video)),
                            runtime=RuntimeConfig(max_frames=25), power=PowerConfig(meter="null"))
    path = tmp_path / "run.html"
    path.write_text("an older report")
    observers: list[object] = []
    report = attach_report(observers, path, budget_w=None)
    assert observers == [report]
    summary = Pipeline(config, observers=observers, handle_signals=False).run()  # type: ignore[arg-type]
    assert report.written == path and report.error is None
    text = path.read_text(encoding="utf-8")
    data = _embedded(text)
    assert data["summary"]["frames"] == summary["frames"] == 25
    assert data["series"]["frames"][-1] == 25 and data["series"]["points"] >= 1  # the tail is never lost
    assert data["budget_w"] is None and 'data-chart="watts"' not in text
    assert "No power meter on this machine" in text
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.html", "tiny.onnx", "v.avi"]  # no temp file left


def test_unwritable_targets_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="does not exist"):
        attach_report([], tmp_path / "missing" / "r.html")
    with pytest.raises(ReportError, match="is a directory"):
        attach_report([], tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ReportError, match="not writable"):
            attach_report([], locked / "r.html")
    (tmp_path / "d.html").mkdir()
    with pytest.raises(ReportError, match="cannot write the report") as info:
        write_page(tmp_path / "d.html", "<p>x</p>")
    assert "\n" not in str(info.value)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_run_of_two_sources_charts_each_source(tmp_path: Path) -> None:
    a = make_video(tmp_path / "a.avi", frames=40, size=(96, 64))
    b = make_video(tmp_path / "b.avi", frames=20, size=(96, 64))
    model = tiny_detector(tmp_path / "tiny.onnx")
    config = PipelineConfig(model=ModelConfig(path=str(model)),
                            sources=(SourceConfig(uri=str(a), name="door"), SourceConfig(uri=str(b), name="yard")),
                            power=PowerConfig(meter="null"))
    path = tmp_path / "run.html"
    observers: list[object] = []
    attach_report(observers, path)
    summary = Pipeline(config, observers=observers, handle_signals=False).run()  # type: ignore[arg-type]
    text = path.read_text(encoding="utf-8")
    series = _embedded(text)["series"]
    assert 'data-chart="fps-per-source"' in text and "source door" in text and "source yard" in text
    per_source = series["sources"]
    assert sorted(per_source) == ["door", "yard"]
    # the last point holds each source's own total, as the summary has it
    assert [per_source[n]["frames"][-1] for n in ("door", "yard")] == [40, 20]
    assert [s["frames"] for s in summary["sources"]] == [40, 20]
    assert all(len(p["fps"]) == series["points"] for p in per_source.values())
    assert all(v is not None and v >= 0 for p in per_source.values() for v in p["fps"])
