"""Several sources in one pipeline: every frame of each, tagged with its source, batched across sources.

Real videos written with OpenCV, real tiny ONNX detectors (one with a dynamic batch), real ONNX Runtime, the
real CLI in subprocesses where the user would type it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.errors import ConfigError
from edgert.io.sinks import FrameResult, Sink, StreamInfo
from edgert.pipeline import Pipeline
from tests.pipeline.media import VanishingCamera, make_video, tiny_detector

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

COUNTS = (23, 17, 31, 9)  # frames per video: different lengths, so sources end at different times


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("many")
    videos = [make_video(root / f"v{i}.avi", frames=n, size=(96 + 16 * i, 64)) for i, n in enumerate(COUNTS)]
    return {"videos": videos, "model": tiny_detector(root / "t.onnx"),
            "batched": tiny_detector(root / "tb.onnx", dynamic_batch=True, box=(10, 12, 6, 8))}


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgert.cli.main", "run", *args], capture_output=True, text=True,
                          timeout=300)


def test_four_file_sources_deliver_every_frame_tagged(media: dict[str, object], tmp_path: Path) -> None:
    videos = media["videos"]
    assert isinstance(videos, list)
    events = tmp_path / "e.jsonl"
    args = [a for v in videos for a in ("--source", str(v))]
    proc = _cli("--model", str(media["model"]), *args, "--sink", f"jsonl://{events}", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    lines = _lines(events)
    assert summary["frames"] == len(lines) == sum(COUNTS)
    for i, n in enumerate(COUNTS):
        mine = [line["frame"] for line in lines if line["source"] == str(i)]
        assert mine == list(range(n))  # every frame of each source, in its order
    per_source = {s["name"]: s for s in summary["sources"]}
    assert [per_source[str(i)]["frames"] for i in range(4)] == list(COUNTS)
    assert all(s["ended"] == "end of input" and s["fps"] > 0 for s in summary["sources"])
    assert summary["stopped_by"] == "end of input"


def test_batching_across_sources_gives_each_source_its_own_detections(media: dict[str, object]) -> None:
    videos = media["videos"]
    assert isinstance(videos, list)
    model = str(media["batched"])
    seen: dict[str, list[tuple[int, list[float]]]] = {}

    class Collect(Sink):
        lossless, queue_size = True, 1024

        def __init__(self) -> None:
            super().__init__("collect://")
            self.rows: list[tuple[str | None, int, list[float]]] = []

        def open(self, info: StreamInfo) -> None: ...

        def write(self, result: FrameResult) -> None:
            self.rows.append((result.source, result.index, result.detections.xyxy.ravel().tolist()))

    sink = Collect()
    config = PipelineConfig(model=ModelConfig(path=model), sources=tuple(SourceConfig(uri=str(v)) for v in videos),
                            runtime=RuntimeConfig(slots=2, batch=4))
    pipeline = Pipeline(config, sinks=[sink], handle_signals=False)
    summary = pipeline.run()
    assert summary["batch"] == 4 and summary["processor"]["batch"] == 4
    for name, index, box in sink.rows:
        seen.setdefault(str(name), []).append((index, box))
    # The same model on each source alone, batch 1: the same boxes for the same frames (within 1 px).
    for i, video in enumerate(videos):
        alone = Collect()
        Pipeline(PipelineConfig(model=ModelConfig(path=model), source=SourceConfig(uri=str(video))),
                 sinks=[alone], handle_signals=False).run()
        ref = [(index, box) for _, index, box in alone.rows]
        got = sorted(seen[str(i)])
        assert [g[0] for g in got] == [r[0] for r in ref] == list(range(COUNTS[i]))
        for (_, a), (_, b) in zip(ref, got):
            assert len(a) == len(b) and np.abs(np.array(a) - np.array(b)).max() <= 1.0


def test_a_batch_one_model_runs_sources_in_rotation(media: dict[str, object], tmp_path: Path) -> None:
    videos = media["videos"]
    assert isinstance(videos, list)
    config = PipelineConfig(model=ModelConfig(path=str(media["model"])),
                            sources=tuple(SourceConfig(uri=str(v)) for v in videos[:2]),
                            runtime=RuntimeConfig(batch=1))
    summary = Pipeline(config, handle_signals=False).run()
    assert summary["batch"] == 1 and summary["frames"] == COUNTS[0] + COUNTS[1]


def test_source_placeholder_gives_each_source_its_own_sink(media: dict[str, object], tmp_path: Path) -> None:
    videos = media["videos"]
    assert isinstance(videos, list)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        f"model: {{path: {media['model']}}}\n"
        "sources:\n"
        f"  - {{uri: {videos[0]}, name: door}}\n"
        f"  - {{uri: {videos[1]}, name: lane, sinks: ['{tmp_path}/lane.mp4']}}\n"
        f"sinks: ['jsonl://{tmp_path}/{{source}}.jsonl']\n")
    proc = _cli("--config", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    door, lane = _lines(tmp_path / "door.jsonl"), _lines(tmp_path / "lane.jsonl")
    assert len(door) == COUNTS[0] and {line["source"] for line in door} == {"door"}
    assert len(lane) == COUNTS[1] and {line["source"] for line in lane} == {"lane"}
    cv2 = pytest.importorskip("cv2")
    cap = cv2.VideoCapture(str(tmp_path / "lane.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == COUNTS[1] and int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)) == 112


def test_a_shared_video_sink_with_several_sources_is_refused(media: dict[str, object], tmp_path: Path) -> None:
    videos = media["videos"]
    assert isinstance(videos, list)
    proc = _cli("--model", str(media["model"]), "--source", str(videos[0]), "--source", str(videos[1]),
                "--sink", str(tmp_path / "all.mp4"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "{source} placeholder" in proc.stderr


def test_duplicate_source_names_are_refused(media: dict[str, object], tmp_path: Path) -> None:
    videos = media["videos"]
    assert isinstance(videos, list)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsources:\n  - {{uri: {videos[0]}, name: a}}\n"
                   f"  - {{uri: {videos[1]}, name: a}}\n")
    proc = _cli("--config", str(cfg))
    assert proc.returncode == 1 and "source names must differ; a appears more than once" in proc.stderr
    with pytest.raises(ConfigError):
        from edgert.config import load_config

        load_config(cfg)


def test_a_source_that_vanishes_does_not_stop_the_others(media: dict[str, object], tmp_path: Path) -> None:
    from edgert.io.sources import open_source

    videos = media["videos"]
    assert isinstance(videos, list)
    events = tmp_path / "e.jsonl"
    config = PipelineConfig(model=ModelConfig(path=str(media["model"])))
    sources = [open_source(str(videos[2])), VanishingCamera(5)]
    summary = Pipeline(config, sources=sources, sinks=[f"jsonl://{events}"], handle_signals=False).run()
    per = {s["name"]: s for s in summary["sources"]}
    assert per["0"]["frames"] == COUNTS[2] and per["0"]["ended"] == "end of input"
    assert per["1"]["frames"] == 5 and per["1"]["ended"] == "error" and "device removed" in per["1"]["error"]
    assert len(_lines(events)) == COUNTS[2] + 5


def test_the_cpu_processor_runs_sources_in_rotation_by_default(media: dict[str, object]) -> None:
    videos = media["videos"]
    assert isinstance(videos, list)
    config = PipelineConfig(model=ModelConfig(path=str(media["batched"])),
                            sources=tuple(SourceConfig(uri=str(v)) for v in videos[:3]))
    summary = Pipeline(config, handle_signals=False).run()
    assert summary["processing"] == "cpu" and summary["batch"] == 1 and summary["frames"] == sum(COUNTS[:3])


def test_metrics_carry_a_source_label(media: dict[str, object]) -> None:
    from edgert.service.metrics import MetricsObserver

    videos = media["videos"]
    assert isinstance(videos, list)
    metrics = MetricsObserver(pipeline="two")
    config = PipelineConfig(model=ModelConfig(path=str(media["model"])),
                            sources=(SourceConfig(uri=str(videos[0]), name="door"),
                                     SourceConfig(uri=str(videos[1]), name="lane")))
    Pipeline(config, observers=[metrics], handle_signals=False).run()
    text = metrics.render()
    assert 'edgert_source_frames_total{source="door"}' in text and 'edgert_source_frames_total{source="lane"}' in text
    door = [line for line in text.splitlines() if line.startswith('edgert_source_frames_total{source="door"}')]
    assert int(float(door[0].split()[-1])) >= COUNTS[0] - 10  # refreshed every 10 frames
