"""``source.realtime``: a video file delivered at its own frame rate, as a camera would, in this process and in
a capture worker; refused in one line where it cannot apply; a stop ends a wait at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgert.config import SourceConfig
from edgert.errors import ConfigError
from edgert.io.sources import open_source
from tests.pipeline.media import make_video, tiny_detector

pytest.importorskip("cv2")


def _deliveries(path: Path, count: int, **options: object) -> list[float]:
    times = []
    with open_source(SourceConfig(uri=str(path), realtime=True, **options)) as src:  # type: ignore[arg-type]
        for _ in range(count):
            assert src.read() is not None
            times.append(time.monotonic())
    return [t - times[0] for t in times]


def test_frames_come_no_earlier_than_their_media_time(tmp_path: Path) -> None:
    at = _deliveries(make_video(tmp_path / "v.avi", frames=12, fps=20.0), 12)
    # 12 small MJPEG frames decode in a few ms: without the pacing the last would come ~0.55 s early
    assert all(t >= i / 20.0 - 0.003 for i, t in enumerate(at)), at


def test_a_looped_file_keeps_its_clock_across_passes(tmp_path: Path) -> None:
    at = _deliveries(make_video(tmp_path / "v.avi", frames=5, fps=20.0), 12, loop=True)
    assert at[11] >= 11 / 20.0 - 0.003, at  # the second and third passes follow the first, not restart at 0


def test_stop_ends_a_wait_at_once(tmp_path: Path) -> None:
    video = make_video(tmp_path / "slow.avi", frames=4, fps=0.5)  # two seconds between frames
    with open_source(SourceConfig(uri=str(video), realtime=True)) as src:
        assert src.read() is not None
        threading.Timer(0.2, src.stop).start()
        t0 = time.monotonic()
        src.read()  # would wait 2 s for frame 1
        assert time.monotonic() - t0 < 1.5
        assert src.read() is None and src.end_reason == "stopped"


def test_refused_for_sources_with_no_frame_rate_of_their_own(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ConfigError, match=r"^source.realtime \(--realtime\): .* is a images source; only a video"):
        open_source(SourceConfig(uri=str(image), realtime=True))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgert.cli.main", "run", *args], capture_output=True, text=True,
                          timeout=180)


def test_cli_paces_every_source_in_capture_workers(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=15, fps=10.0)
    model = tiny_detector(tmp_path / "t.onnx")
    proc = _run("--backend", "onnxruntime", "--model", str(model), "--source", str(video), "--source", str(video),
                "--capture", "process", "--realtime", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert [s["frames"] for s in summary["sources"]] == [15, 15]
    assert {s["capture"] for s in summary["sources"]} == {"process"}
    # 15 frames at 10 fps: 1.4 s from the first to the last; unpaced, this model runs them in a few ms
    assert all(s["fps"] <= 10.5 for s in summary["sources"]), summary["sources"]


@pytest.mark.parametrize("extra", [["--preload"], []])
def test_cli_refusals_are_one_line(tmp_path: Path, extra: list[str]) -> None:
    import cv2
    import numpy as np

    model = tiny_detector(tmp_path / "t.onnx")
    if extra:
        source = str(make_video(tmp_path / "v.avi", frames=3))
        want = "edgert: error: source.realtime cannot apply to a preloaded source"
    else:
        source = str(tmp_path / "a.png")
        cv2.imwrite(source, np.zeros((8, 8, 3), np.uint8))
        want = "edgert: error: source.realtime (--realtime): "
    proc = _run("--backend", "onnxruntime", "--model", str(model), "--source", source, "--realtime", *extra)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith(want), proc.stderr


def _latency(*args: str) -> dict[str, dict[str, float]]:
    proc = _run("--backend", "onnxruntime", "--capture", "thread", "--realtime", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    latency: dict[str, dict[str, float]] = json.loads(proc.stdout)["latency_ms"]
    return latency


def test_latency_counts_from_when_a_frame_is_due(tmp_path: Path) -> None:
    # A camera's frame exists from its time on: the read that waited a frame interval for it (100 ms) is not latency
    latency = _latency("--model", str(tiny_detector(tmp_path / "t.onnx")),
                       "--source", str(make_video(tmp_path / "v.avi", frames=10, fps=10.0)))
    assert latency["capture"]["p95"] < 30 and latency["total"]["p50"] < 50, latency


def test_a_batch_is_not_held_for_a_straggler_while_the_engine_is_idle(tmp_path: Path) -> None:
    # A 10 fps camera batched with a 2 fps one: held for a straggler (the next frame of either, up to 400 ms), the
    # fast one's frames would wait ~a frame interval (100 ms) each; with no batch in flight, each goes as it is
    latency = _latency("--model", str(tiny_detector(tmp_path / "t.onnx")), "--batch", "2", "--batch-timeout-ms", "400",
                       "--source", str(make_video(tmp_path / "fast.avi", frames=20, fps=10.0)),
                       "--source", str(make_video(tmp_path / "slow.avi", frames=4, fps=2.0)))
    assert latency["total"]["p95"] < 50, latency


def _first_and_spacing(path: Path, phase: float, cls: type | None = None) -> tuple[float, float]:
    """When a realtime source's first frame comes after opening, and the second after the first."""
    from edgert.io.sources import video_file_source

    config = SourceConfig(uri=str(path), realtime=True, realtime_phase=phase)
    with open_source(config) if cls is None else video_file_source(config.uri, config, cls) as src:
        t0 = time.monotonic()
        assert src.read() is not None
        first = time.monotonic() - t0
        assert src.read() is not None
        return first, time.monotonic() - t0 - first


def test_a_phase_puts_a_source_that_much_of_an_interval_late(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=4, fps=5.0)  # 200 ms between frames
    first, spacing = _first_and_spacing(video, 0.5)
    assert 0.095 <= first < 0.16 and 0.19 <= spacing < 0.26, (first, spacing)  # 100 ms late, then on its clock
    first, _ = _first_and_spacing(video, 0.0)
    assert first < 0.05, first  # in step: the first frame at once


def test_stagger_spreads_the_sources_over_one_interval(tmp_path: Path) -> None:
    from edgert.cli.main import build_parser
    from edgert.cli.run import build_config

    video = str(make_video(tmp_path / "v.avi", frames=3))
    args = build_parser().parse_args(["run", *[a for _ in range(4) for a in ("--source", video)], "--realtime",
                                      "--stagger"])
    assert [s.realtime_phase for s in build_config(args).all_sources()] == [0.0, 0.25, 0.5, 0.75]
    with pytest.raises(ConfigError, match=r"^--stagger: .* Note: add --realtime$"):
        build_config(build_parser().parse_args(["run", "--source", video, "--source", video, "--stagger"]))
    with pytest.raises(ConfigError, match=r"^--stagger: one source has no other"):
        build_config(build_parser().parse_args(["run", "--source", video, "--realtime", "--stagger"]))


def test_a_phase_without_realtime_or_past_one_interval_is_refused(tmp_path: Path) -> None:
    from edgert.config.schema import FieldError

    with pytest.raises(FieldError, match=r"^applies to a source delivered at its own rate only"):
        SourceConfig(uri="v.avi", realtime_phase=0.5)
    with pytest.raises(FieldError, match=r"^expected a fraction of a frame interval 0 <= x < 1, got 1.0$"):
        SourceConfig(uri="v.avi", realtime=True, realtime_phase=1.0)


def test_the_summary_counts_engine_calls_and_how_full_they_ran(tmp_path: Path) -> None:
    model, video = str(tiny_detector(tmp_path / "t.onnx")), str(make_video(tmp_path / "v.avi", frames=12))
    one = json.loads(_run("--backend", "onnxruntime", "--model", model, "--source", video, "--json").stdout)
    assert (one["batches"], one["batch_fill"]) == (12, 1.0), one  # one source, batch 1: a call a frame
    two = json.loads(_run("--backend", "onnxruntime", "--model", model, "--source", video, "--source", video,
                          "--batch", "2", "--capture", "thread", "--json").stdout)
    assert two["frames"] == 24 and 12 <= two["batches"] <= 24, two
    assert two["batch_fill"] == round(24 / (2 * two["batches"]), 3), two


def test_a_jetson_workers_hardware_decoded_file_keeps_realtime_and_its_phase(tmp_path: Path) -> None:
    # A Jetson's capture worker opens files through GstVideoFileSource (nvv4l2decoder), which dropped
    # source.realtime before. Here GStreamer cannot take it and it falls back to FFmpeg: the pacing is the same.
    from edgert.io.capture.jetson import GstVideoFileSource

    first, spacing = _first_and_spacing(make_video(tmp_path / "v.avi", frames=4, fps=5.0), 0.5, GstVideoFileSource)
    assert 0.095 <= first < 0.16 and 0.19 <= spacing < 0.26, (first, spacing)
