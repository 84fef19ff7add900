"""WER with Whisper's English normalizer (the whisper-normalizer package) beside the basic one."""

from __future__ import annotations

import pytest

from edgert.speech.wer import normalize_text, wer


def test_basic_normalizer_is_unchanged() -> None:
    assert normalize_text("Cold-hearted, Mr. O'Brien!") == ["cold", "hearted", "mr", "o'brien"]
    assert wer(["ten of clubs"], ["10 of clubs"]) == pytest.approx(1 / 3)


def test_whisper_normalizer_matches_spoken_and_written_forms() -> None:
    pytest.importorskip("whisper_normalizer", reason="pip install whisper-normalizer (Python 3.9+)")
    assert wer(["Ten of clubs."], ["10 of clubs"], "whisper") == 0.0
    assert wer(["Mr. Smith's colour"], ["mister smith's color"], "whisper") == 0.0
    assert normalize_text("Um, the ten [NOISE] of hearts", "whisper") == ["the", "10", "of", "hearts"]
    assert wer(["the king of spades"], ["the queen of spades"], "whisper") == pytest.approx(0.25)


def test_unknown_normalizer_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown normalizer"):
        normalize_text("x", "fancy")
