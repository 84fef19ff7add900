"""Whisper's log-mel front end against a reference built from librosa, on the real clips.

The reference follows Whisper's ``log_mel_spectrogram`` step by step: ``librosa.stft`` (n_fft 400,
hop 160, periodic Hann, centred, reflect padding, as ``torch.stft`` in Whisper), power of all frames
but the last, ``librosa.filters.mel(sr=16000, n_fft=400, n_mels=80)`` (the very matrix Whisper ships
in ``mel_filters.npz``), log10 clamped at 1e-10, max - 8, (x + 4) / 4, on audio zero-padded to 30 s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgert.speech import WhisperFeatures, log_mel_spectrogram, mel_filters, read_audio
from edgert.speech.features import N_FRAMES, hz_to_mel, mel_to_hz, pad_or_trim


def whisper_reference(audio: np.ndarray) -> np.ndarray:
    librosa = pytest.importorskip("librosa")
    x = pad_or_trim(audio.astype(np.float32))
    stft = librosa.stft(x, n_fft=400, hop_length=160, window="hann", center=True, pad_mode="reflect")
    power = np.abs(stft[:, :-1]) ** 2
    mel = librosa.filters.mel(sr=16000, n_fft=400, n_mels=80) @ power
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def test_mel_filters_match_librosa() -> None:
    librosa = pytest.importorskip("librosa")
    for n_mels in (80, 128):
        ref = librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels)
        np.testing.assert_allclose(mel_filters(16000, 400, n_mels), ref, atol=1e-7)


def test_mel_scale_round_trip() -> None:
    hz = np.array([0.0, 300.0, 999.0, 1000.0, 4000.0, 8000.0])
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(hz)), hz, rtol=1e-9, atol=1e-9)


def test_log_mel_matches_reference_on_real_clips(assets: Path) -> None:
    pytest.importorskip("soundfile")
    clips = sorted((assets / "audio").glob("*/*.wav"))
    assert len(clips) >= 10
    features = WhisperFeatures()
    worst = 0.0
    for clip in clips:
        audio = read_audio(clip)
        ours = features(audio)
        assert ours.shape == (1, 80, N_FRAMES) and ours.dtype == np.float32
        worst = max(worst, float(np.abs(ours[0] - whisper_reference(audio)).max()))
    assert worst < 1e-4, worst


def test_features_write_into_a_given_buffer_and_pad() -> None:
    buf = np.full((1, 80, N_FRAMES), np.nan, dtype=np.float32)
    out = WhisperFeatures()(np.zeros(100, dtype=np.float32), out=buf)
    assert out is buf and np.isfinite(buf).all()
    assert log_mel_spectrogram(np.zeros(16000, dtype=np.float32)).shape == (80, 100)
    with pytest.raises(ValueError, match="30 s"):
        WhisperFeatures()(np.zeros(16000 * 31, dtype=np.float32))
