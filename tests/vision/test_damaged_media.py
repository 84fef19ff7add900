"""A video whose later half is damaged: frames counted by reason, one warning with a count, why it ended."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from edgert.config import SourceConfig
from edgert.io.sources import SKIP_DAMAGED_END, SKIP_UNDECODABLE, SKIP_UNREADABLE_IMAGE, open_source
from tests.helpers import run_cli
from tests.pipeline.media import corrupt_avi_frame, make_video, tiny_detector

cv2 = pytest.importorskip("cv2")

FRAMES = 60


def damaged_video(tmp_path: Path) -> Path:
    """An MJPG AVI written by OpenCV with random bytes over a quarter of it, from its middle on."""
    video = make_video(tmp_path / "src.avi", frames=FRAMES)
    data = bytearray(video.read_bytes())
    n = len(data)
    data[n // 2:n // 2 + n // 4] = np.random.default_rng(0).integers(0, 255, n // 4, dtype=np.uint8).tobytes()
    out = tmp_path / "damaged.avi"
    out.write_bytes(bytes(data))
    return out


def _drain(source) -> int:  # type: ignore[no-untyped-def]
    frames = 0
    while source.read() is not None:
        frames += 1
    return frames


def test_damaged_end_is_counted_logged_once_and_explained(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    video = damaged_video(tmp_path)
    with caplog.at_level(logging.WARNING, logger="edgert.io.sources"), open_source(str(video)) as source:
        delivered = _drain(source)
        counters = source.counters()
    assert FRAMES // 3 < delivered < FRAMES  # the first half plays; the damage cuts it short
    reasons = source.skipped_by_reason
    assert reasons[SKIP_DAMAGED_END] > 0
    assert delivered + source.skipped == FRAMES  # every frame the file lists is delivered or counted
    assert source.skipped == sum(reasons.values())
    assert source.ended_early and source.end_reason is not None
    assert source.end_reason.startswith(f"damaged video: no frame decodes after frame {delivered + reasons.get(SKIP_UNDECODABLE, 0)} of {FRAMES}")  # noqa: E501
    assert counters["end_reason"] == source.end_reason and counters["skipped"] == reasons
    undecodable = [r for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert len(undecodable) == 1  # not once per failed read (there were 25 and more)
    totals = [r.getMessage() for r in caplog.records if "in all" in r.getMessage()]
    mid_file = reasons.get(SKIP_UNDECODABLE, 0)  # the stuck read attempts at the end are not frames
    assert totals == ([] if mid_file <= 1 else [totals[0]]) and all(f": {mid_file} in all" in t for t in totals)
    assert sum("damaged video" in r.getMessage() for r in caplog.records) == 1


def test_single_damaged_frame_is_a_skip_not_an_early_end(tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=20)
    bad = corrupt_avi_frame(video, tmp_path / "bad.avi", frame=10)
    with open_source(str(bad)) as source:
        assert _drain(source) == 19
    assert source.skipped_by_reason == {SKIP_UNDECODABLE: 1}
    assert source.end_reason == "end of input" and not source.ended_early


def test_intact_video_ends_normally(tmp_path: Path) -> None:
    with open_source(str(make_video(tmp_path / "v.avi", frames=10))) as source:
        assert source.end_reason is None
        assert _drain(source) == 10
    assert source.end_reason == "end of input" and source.skipped_by_reason == {} and not source.ended_early


def test_looping_over_a_damaged_end_keeps_going_and_counts_each_pass(tmp_path: Path) -> None:
    video = damaged_video(tmp_path)
    with open_source(SourceConfig(uri=str(video), loop=True)) as source:
        got = [source.read() is not None for _ in range(2 * FRAMES)]
    assert all(got) and source.end_reason is None
    assert source.skipped_by_reason[SKIP_DAMAGED_END] >= 2 * (FRAMES - FRAMES * 3 // 4)


def test_broken_images_warn_once_with_a_count(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((8, 8, 3), np.uint8))
    for i in range(5):
        (tmp_path / f"broken{i}.jpg").write_bytes(b"not a jpeg")
    with caplog.at_level(logging.WARNING, logger="edgert.io.sources"), open_source(str(tmp_path)) as source:
        assert _drain(source) == 1
    assert source.skipped_by_reason == {SKIP_UNREADABLE_IMAGE: 5}
    assert sum("cannot decode image" in r.getMessage() for r in caplog.records) == 1
    assert any("5 in all" in r.getMessage() for r in caplog.records)


def test_run_cli_on_a_damaged_video_counts_the_frames_and_warns_once(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    video = damaged_video(tmp_path)
    r = run_cli("run", "--model", str(tiny_detector(tmp_path / "tiny.onnx")), "--source", str(video), "--json",
                timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    with open_source(str(video)) as source:
        delivered = _drain(source)
    assert summary["frames"] == delivered < FRAMES
    # Every lost frame is counted, by reason: the damaged frames in the middle and the undecodable end; as
    # undecodable frames, not as drops (the pipeline dropped nothing: the file lacked them).
    assert summary["undecodable"] == source.skipped_by_reason
    assert sum(summary["undecodable"].values()) == FRAMES - delivered
    assert summary["dropped"] == 0 and summary["drops"] == {}
    assert summary["sources"][0]["undecodable"] == source.skipped_by_reason and summary["sources"][0]["drops"] == {}
    assert summary["stopped_by"].startswith("damaged video: no frame decodes after frame")
    assert r.stderr.count("cannot be decoded") == 1  # once, not once per failed read
    assert r.stderr.count("damaged video: no frame decodes after frame") == 1
