"""Calibration image folders: recursive, deterministic, bad files skipped and counted."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edgert.calib.dataset import CalibrationImages, scan_folder
from edgert.errors import CalibrationError

from .models import write_images

pytest.importorskip("cv2")


def _messy(folder: Path) -> list[Path]:
    good = write_images(folder, 4) + write_images(folder / "sub" / "deeper", 3, seed=1)
    (folder / "corrupt.jpg").write_bytes(good[0].read_bytes()[:200])  # truncated JPEG
    (folder / "notes.txt").write_text("not an image")
    (folder / "empty").mkdir()
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "x.png").write_bytes(good[1].read_bytes())
    return good


def test_recursive_scan_ignores_hidden_entries(tmp_path: Path) -> None:
    good = _messy(tmp_path)
    images, others = scan_folder(tmp_path)
    assert set(images) == {*good, tmp_path / "corrupt.jpg"}
    assert others == [tmp_path / "notes.txt"]


def test_bad_files_are_skipped_counted_and_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = _messy(tmp_path)
    ds = CalibrationImages(tmp_path, num=None, seed=0)
    with caplog.at_level(logging.WARNING):
        got = list(ds)
    assert sorted(p for p, _ in got) == sorted(good)
    assert all(img.ndim == 3 and img.shape[2] == 3 for _, img in got)
    assert ds.skipped == {
        tmp_path / "notes.txt": "not an image file", tmp_path / "corrupt.jpg": "unreadable or corrupt image",
    }
    assert "skipped 2 file(s): 1 unreadable image(s), 1 not an image" in caplog.text


def test_sampling_is_deterministic_and_replaces_unreadable_files(tmp_path: Path) -> None:
    _messy(tmp_path)
    first = [p for p, _ in CalibrationImages(tmp_path, num=5, seed=3)]
    again = [p for p, _ in CalibrationImages(tmp_path, num=5, seed=3)]
    other = [p for p, _ in CalibrationImages(tmp_path, num=5, seed=4)]
    assert first == again and len(first) == 5
    assert first != other
    assert tmp_path / "corrupt.jpg" not in first


def test_fingerprint_changes_when_an_image_changes(tmp_path: Path) -> None:
    good = write_images(tmp_path, 3)
    before = CalibrationImages(tmp_path, num=2).fingerprint()
    assert CalibrationImages(tmp_path, num=2).fingerprint() == before
    good[1].write_bytes(good[0].read_bytes())
    assert CalibrationImages(tmp_path, num=2).fingerprint() != before
    assert CalibrationImages(tmp_path, num=3).fingerprint() != before


def test_empty_or_missing_folders_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("x")
    for folder, needle in [(tmp_path / "empty", "no images"), (tmp_path / "texts", "1 other files ignored"),
                           (tmp_path / "nope", "not found")]:
        with pytest.raises(CalibrationError, match=needle) as info:
            CalibrationImages(folder)
        assert "\n" not in str(info.value)
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "x.jpg").write_bytes(b"\xff\xd8garbage")
    with pytest.raises(CalibrationError, match="could be read"):
        list(CalibrationImages(only_bad))


def test_video_frames_are_spread_and_offset_sets_are_disjoint(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    from edgert.calib.comparison import evaluation_frames, video_frames

    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for i in range(40):
        writer.write(np.full((48, 64, 3), i * 6, np.uint8))
    writer.release()
    first = [label for label, _ in video_frames(path, 5)]
    assert first == [f"clip.avi#{i}" for i in (0, 8, 16, 24, 32)]
    half = [label for label, _ in video_frames(path, 5, offset=0.5)]
    assert half == [f"clip.avi#{i}" for i in (4, 12, 20, 28, 36)]
    write_images(tmp_path / "imgs", 2)
    labels = [label for label, _ in evaluation_frames(tmp_path / "imgs", path, 3)]
    assert len(labels) == 5 and labels[2].startswith("clip.avi#")
