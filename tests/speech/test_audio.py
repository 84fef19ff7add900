"""Audio sources: files (resampling, downmix, truncation), folders, and microphones through a real
``arecord`` subprocess (a stand-in program that writes PCM as arecord does)."""

from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from edgert.errors import SourceError
from edgert.speech import read_audio, resample
from edgert.speech.audio import FileSource, FolderSource, MicSource

from .conftest import fake_arecord

sf = pytest.importorskip("soundfile")
SR = 16000


def tone(rate: int, seconds: float, freq: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    x = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def peak_hz(x: np.ndarray, rate: int = SR) -> float:
    spec = np.abs(np.fft.rfft(x))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[spec.argmax()])


def test_file_chunks_have_fixed_size_and_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    sf.write(path, tone(SR, 1.0), SR, subtype="PCM_16")
    with FileSource(path, chunk_samples=512) as src:
        chunks = list(src)
    assert [len(c.samples) for c in chunks[:-1]] == [512] * (len(chunks) - 1)
    assert sum(len(c.samples) for c in chunks) == SR
    assert chunks[3].start == pytest.approx(3 * 512 / SR)
    assert chunks[-1].last and not any(c.last for c in chunks[:-1])
    assert src.stats()["seconds"] == pytest.approx(1.0)
    assert src.audio is None  # 16 kHz mono is read chunk by chunk, not decoded whole
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), read_audio(path))


def test_44k_stereo_is_resampled_to_16k_mono_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "stereo.flac"
    sf.write(path, tone(44100, 1.0, channels=2), 44100)
    with caplog.at_level(logging.WARNING):
        audio = read_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert len(audio) == pytest.approx(SR, abs=2)
    assert peak_hz(audio) == pytest.approx(440, abs=2)
    assert "resampled 44100 Hz, 2 channel(s) to 16000 Hz mono" in caplog.text


def test_resample_keeps_a_tone() -> None:
    out = resample(tone(8000, 1.0, 1000.0), 8000)
    assert len(out) == SR and peak_hz(out) == pytest.approx(1000, abs=2)


def test_too_low_rate_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "low.wav"
    sf.write(path, tone(4000, 0.5), 4000, subtype="PCM_16")
    with pytest.raises(SourceError, match="4000 Hz is too low"):
        read_audio(path)


def test_truncated_wav_is_an_error(tmp_path: Path, librivox: Path) -> None:
    data = (librivox / "sense_and_sensibility_01_austen_64kb-0880.wav").read_bytes()
    path = tmp_path / "cut.wav"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match="truncated WAV"):
        FileSource(path)
    (tmp_path / "hdr.wav").write_bytes(data[:30])
    with pytest.raises(SourceError, match=r"hdr\.wav"):
        FileSource(tmp_path / "hdr.wav")


def test_audio_uris_are_rows_of_the_one_source_table(tmp_path: Path) -> None:
    """A file, a folder of clips, alsa:// and mic:// are understood by the source table's audio rows only."""
    from edgert.io.sources import SOURCES, open_source

    sf.write(tmp_path / "a.wav", tone(SR, 0.5), SR)
    kinds = {row.name: row for row in SOURCES}
    assert {"audio-file", "audio-folder", "audio-live"} <= set(kinds)
    assert kinds["audio-folder"].accepts(str(tmp_path)) and not kinds["images"].accepts("alsa://default")
    src = open_source(str(tmp_path / "a.wav"))
    assert src.kind == "audio" and getattr(src, "audio", False)
    assert open_source(str(tmp_path)).kind == "audio" and open_source("mic://0").kind == "audio-live"
    with pytest.raises(SourceError, match="not found"), open_source("/nonexistent/a.wav"):
        pass


def test_folder_skips_and_counts_unreadable_clips(tmp_path: Path) -> None:
    sf.write(tmp_path / "a.wav", tone(SR, 0.5), SR)
    (tmp_path / "b.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    sf.write(tmp_path / "c.flac", tone(SR, 0.25), SR)
    (tmp_path / "notes.txt").write_text("not audio")
    with FolderSource(tmp_path, chunk_samples=1600) as src:
        chunks = list(src)
    streams = [c.stream for c in chunks]
    assert streams[0].endswith("a.wav") and streams[-1].endswith("c.flac")
    assert sum(c.last for c in chunks) == 2 and src.skipped == 1
    assert chunks[-1].start == pytest.approx(3200 / SR)  # timestamps restart per clip


def test_missing_microphone_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no arecord anywhere
    with pytest.raises(SourceError, match="arecord not found"):
        MicSource("alsa://default?via=arecord")
    with pytest.raises(SourceError, match="mic://7"):
        MicSource("mic://7")  # sounddevice: no PortAudio or no device 7; then no arecord
    with pytest.raises(SourceError, match="device number"):
        MicSource("mic://front")


def test_arecord_microphone_streams_with_timestamps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wav = tmp_path / "in.wav"
    sf.write(wav, tone(SR, 1.0), SR, subtype="PCM_16")
    monkeypatch.setenv("PATH", f"{fake_arecord(tmp_path / 'bin', wav)}{os.pathsep}{os.environ['PATH']}")
    with MicSource("mic://0?via=arecord", chunk_samples=1600) as src:
        got = []
        for chunk in src:
            got.append(chunk)
            if len(got) == 10:
                break
    assert src.via == "arecord" and src.live
    assert [c.start for c in got] == pytest.approx([i * 0.1 for i in range(10)])
    np.testing.assert_allclose(np.concatenate([c.samples for c in got]), tone(SR, 1.0), atol=1e-4)
    assert src.overruns == 0


def test_slow_consumer_drops_and_counts_overruns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wav = tmp_path / "in.wav"
    sf.write(wav, tone(SR, 4.0), SR, subtype="PCM_16")
    monkeypatch.setenv("PATH", f"{fake_arecord(tmp_path / 'bin', wav)}{os.pathsep}{os.environ['PATH']}")
    src = MicSource("alsa://default?via=arecord", chunk_samples=1600, queue_seconds=0.5)
    try:
        time.sleep(1.0)  # the device delivers 4 s at once while nobody reads
        chunks = []
        for chunk in src:
            chunks.append(chunk)
            if chunk.start >= 3.85:
                break
    finally:
        src.close()
    assert src.overruns > 0 and src.dropped_samples == src.overruns * 1600
    assert len(chunks) <= 6  # only the freshest 0.5 s survived
    # Timestamps count captured samples, dropped ones included: the last chunk is at 3.9 s.
    assert chunks[-1].start == pytest.approx(3.9)


def test_microphone_that_fails_to_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_arecord(tmp_path / 'bin', None, mode='fail')}{os.pathsep}{os.environ['PATH']}")
    with MicSource("alsa://hw:9,0?via=arecord") as src, pytest.raises(SourceError, match="audio open error"):
        list(src)


def test_real_arecord_on_the_alsa_null_device() -> None:
    import shutil

    if shutil.which("arecord") is None:
        pytest.skip("arecord (alsa-utils) not installed")
    with MicSource("alsa://null?via=arecord", chunk_samples=1600) as src:
        got = []
        for chunk in src:
            got.append(chunk)
            if len(got) == 5:
                break
        overruns = src.overruns
    starts = [c.start for c in got]
    assert all(len(c.samples) == 1600 and c.samples.dtype == np.float32 for c in got)
    # Timestamps count captured samples, dropped ones included: chunk i starts at 0.1 * (i + chunks dropped
    # before it). ALSA's null device is not paced by a clock, so the grabber can outrun the reader and drop
    # (and count) chunks; each one dropped shifts the later timestamps by exactly one chunk.
    assert all(abs(t * 10 - round(t * 10)) < 1e-6 for t in starts)
    assert all(b > a for a, b in itertools.pairwise(starts))
    assert all(0.1 * i - 1e-6 <= t <= 0.1 * (i + overruns) + 1e-6 for i, t in enumerate(starts))
    if overruns == 0:
        assert starts == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
