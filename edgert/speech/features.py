"""Whisper's log-mel spectrogram in numpy.

The recipe is Whisper's own (``whisper/audio.py``): a centred STFT with a periodic Hann window of 400
samples, hop 160, reflect padding, power spectrum without the last frame, Slaney-style mel filters
(librosa's defaults, which Whisper ships as ``mel_filters.npz``), ``log10`` clamped at 1e-10, the
dynamic range clamped to 8 (in log10 units) below the maximum, then ``(x + 4) / 4``. The encoder sees
exactly 30 s: shorter audio is zero-padded *before* the STFT, as Whisper's ``pad_or_trim`` does.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = [
    "HOP_LENGTH",
    "N_FFT",
    "N_FRAMES",
    "N_SAMPLES",
    "SAMPLE_RATE",
    "WhisperFeatures",
    "hz_to_mel",
    "log_mel_spectrogram",
    "mel_filters",
    "mel_to_hz",
    "pad_or_trim",
]

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window


def hz_to_mel(freqs: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa ``htk=False``): linear below 1 kHz, logarithmic above."""
    freqs = np.asarray(freqs, dtype=np.float64)
    f_sp = 200.0 / 3.0
    mels = freqs / f_sp
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    log_region = freqs >= min_log_hz
    mels = np.where(log_region, min_log_mel + np.log(np.maximum(freqs, min_log_hz) / min_log_hz) / logstep, mels)
    return mels


def mel_to_hz(mels: np.ndarray) -> np.ndarray:
    """Inverse of :func:`hz_to_mel`."""
    mels = np.asarray(mels, dtype=np.float64)
    f_sp = 200.0 / 3.0
    freqs = f_sp * mels
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    log_region = mels >= min_log_mel
    return np.where(log_region, min_log_hz * np.exp(logstep * (mels - min_log_mel)), freqs)


@lru_cache(maxsize=8)
def mel_filters(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = 80) -> np.ndarray:
    """Triangular mel filters [n_mels, 1 + n_fft // 2], Slaney area-normalised (librosa's defaults)."""
    fftfreqs = np.fft.rfftfreq(n_fft, d=1.0 / sr)
    mel_pts = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sr / 2.0)), n_mels + 2))
    fdiff = np.diff(mel_pts)
    ramps = mel_pts[:, None] - fftfreqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_pts[2 : n_mels + 2] - mel_pts[:n_mels])  # each filter has unit area
    weights *= enorm[:, None]
    out: np.ndarray = weights.astype(np.float32)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=4)
def _hann(n: int) -> np.ndarray:
    # Periodic Hann (torch.hann_window / scipy get_window('hann', fftbins=True)): the DFT-even window.
    win: np.ndarray = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float32)
    win.setflags(write=False)
    return win


def pad_or_trim(audio: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
    """Zero-pad or cut ``audio`` to ``length`` samples (Whisper's ``pad_or_trim``)."""
    if audio.shape[-1] > length:
        return audio[..., :length]
    if audio.shape[-1] < length:
        pad = [(0, 0)] * (audio.ndim - 1) + [(0, length - audio.shape[-1])]
        return np.pad(audio, pad)
    return audio


def log_mel_spectrogram(audio: np.ndarray, n_mels: int = 80, padding: int = 0) -> np.ndarray:
    """Whisper's log-mel features [n_mels, frames] of 16 kHz mono float audio.

    ``padding`` zeros are appended first (Whisper's ``transcribe`` passes 30 s). For the encoder's
    fixed [80, 3000] input use :class:`WhisperFeatures`.
    """
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono audio [samples], got shape {x.shape}")
    if padding:
        x = np.pad(x, (0, padding))
    half = N_FFT // 2
    if x.shape[0] <= half:  # reflect padding needs more samples than half a window
        x = np.pad(x, (0, half + 1 - x.shape[0]))
    padded = np.pad(x, (half, half), mode="reflect")
    n_frames = 1 + (padded.shape[0] - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(
        padded, shape=(n_frames, N_FFT), strides=(padded.strides[0] * HOP_LENGTH, padded.strides[0])
    )
    spectrum = np.fft.rfft(frames * _hann(N_FFT), axis=1)
    power = (spectrum.real**2 + spectrum.imag**2)[:-1].astype(np.float32)  # Whisper drops the last frame
    mel = mel_filters(SAMPLE_RATE, N_FFT, n_mels) @ power.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    out: np.ndarray = ((log_spec + 4.0) / 4.0).astype(np.float32)
    return out


class WhisperFeatures:
    """The encoder's input: [1, n_mels, 3000] log-mel of up to 30 s of audio, written into ``out``.

    ``out`` may be a session's preallocated input buffer, so the encoder reads the features in place.
    """

    def __init__(self, n_mels: int = 80) -> None:
        self.n_mels = n_mels

    def __call__(self, audio: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if audio.shape[-1] > N_SAMPLES:
            seconds = audio.shape[-1] / SAMPLE_RATE
            raise ValueError(f"Whisper reads at most {CHUNK_SECONDS} s per window; got {seconds:.1f} s")
        mel = log_mel_spectrogram(pad_or_trim(audio), self.n_mels)[:, :N_FRAMES]
        if out is None:
            out = np.empty((1, self.n_mels, N_FRAMES), dtype=np.float32)
        out.reshape(self.n_mels, N_FRAMES)[...] = mel
        return out
