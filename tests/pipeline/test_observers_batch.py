"""Observers told once per batch (``on_frames``) when every observer of the run takes a batch, per frame as
before when one does not; the run's power and telemetry observers pick the same refresh points either way.

Real videos, a real tiny ONNX detector with a dynamic batch on ONNX Runtime, a real pipeline run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.pipeline import BaseObserver, Pipeline, PipelineStats
from edgert.pipeline.hooks import _passed
from tests.pipeline.media import make_video, tiny_detector

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")


class _Batches(BaseObserver):
    """Takes batches: the counts it saw at each call, and whether it was ever called per frame."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.started_at: int | None = None
        self.per_frame = 0

    def on_start(self, info: Any) -> None:
        self.started_at = info["stats"].frames

    def on_frame(self, stats: PipelineStats) -> None:
        self.per_frame += 1
        self.counts.append(stats.frames)

    def on_frames(self, stats: PipelineStats) -> None:
        self.counts.append(stats.frames)


class _EveryFrame(BaseObserver):
    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_frame(self, stats: PipelineStats) -> None:
        self.counts.append(stats.frames)


def _run(tmp_path: Path, observers: list[Any]) -> dict[str, Any]:
    videos = [make_video(tmp_path / f"v{i}.avi", frames=12, size=(64, 48)) for i in range(4)]
    model = tiny_detector(tmp_path / "t.onnx", dynamic_batch=True)
    config = PipelineConfig(model=ModelConfig(path=str(model)),
                            sources=tuple(SourceConfig(uri=str(v), capture="thread") for v in videos),
                            runtime=RuntimeConfig(batch=4))
    return Pipeline(config, observers=observers, handle_signals=False, environment=False).run()


def test_observers_that_take_batches_are_told_once_per_batch(tmp_path: Path) -> None:
    batches = _Batches()
    summary = _run(tmp_path, [batches])
    assert summary["frames"] == 48
    assert batches.per_frame == 0 and batches.started_at is not None and batches.started_at >= 1
    assert batches.counts[-1] == 48 and batches.counts == sorted(set(batches.counts))
    assert len(batches.counts) < 48  # batches of several frames: fewer calls than frames


def test_one_observer_that_needs_every_frame_has_every_observer_told_per_frame(tmp_path: Path) -> None:
    batches, every = _Batches(), _EveryFrame()
    summary = _run(tmp_path, [batches, every])
    assert summary["frames"] == 48
    assert every.counts == list(range(1, 49))  # each count, in turn: the per-frame rule's tests hold
    assert batches.counts == list(range(1, 49)) and batches.per_frame == 48


@pytest.mark.parametrize("every", [10, 40, 160])
@pytest.mark.parametrize("steps", [[1] * 200, [16] * 12 + [3, 5], [7, 1, 30, 2, 64, 9, 11], [160, 1, 159, 1]])
def test_a_batch_passes_a_refresh_point_exactly_when_one_of_its_frames_is_one(every: int, steps: list[int]) -> None:
    """PowerWatts / TelemetryObserver: ``on_frames`` refreshes in a batch iff ``on_frame`` would have for one of
    its frames (``frames % every == 1``)."""
    before = 0
    for n in steps:
        after = before + n
        assert _passed(before, after, every) == any(c % every == 1 for c in range(before + 1, after + 1))
        before = after


class _StartOnly(BaseObserver):
    """Overrides no frame method (like ``edgert run``'s preview announcer): needs no frame's count."""

    def __init__(self) -> None:
        self.started = False

    def on_start(self, info: Any) -> None:
        self.started = True


def test_an_observer_that_needs_no_frame_keeps_the_batches(tmp_path: Path) -> None:
    batches, start = _Batches(), _StartOnly()
    summary = _run(tmp_path, [batches, start])
    assert summary["frames"] == 48 and start.started
    assert batches.per_frame == 0 and batches.counts[-1] == 48 and len(batches.counts) < 48


def test_the_service_and_cli_observers_take_batches_and_an_old_subclass_does_not() -> None:
    from edgert.cli.run import _Progress
    from edgert.pipeline.observer import needs_every_frame
    from edgert.report.series import SeriesRecorder
    from edgert.service.metrics import MetricsObserver
    from edgert.service.watchdog import SystemdObserver

    for kind in (SystemdObserver, MetricsObserver, SeriesRecorder, _Progress, _StartOnly, _Batches):
        assert not needs_every_frame(object.__new__(kind)), kind.__name__
    assert needs_every_frame(_EveryFrame())  # overrides on_frame only: every count, as before batches
    assert needs_every_frame(object())  # no on_frames at all
