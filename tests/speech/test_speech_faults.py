"""Speech runs under faults: a bad WAV leaves existing outputs alone; Whisper alone on silence writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ..helpers import assert_one_line_error, run_cli

sf = pytest.importorskip("soundfile")
SR = 16000


def test_bad_wav_leaves_the_existing_events_file_alone(tmp_path: Path, speech_models: Path, librivox: Path) -> None:
    data = (librivox / "sense_and_sensibility_01_austen_64kb-0870.wav").read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) // 3])
    events = tmp_path / "events.jsonl"
    events.write_text('{"type": "segment"}\n' * 100)
    before = events.read_bytes()
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--source", str(cut),
                "--sink", f"jsonl://{events}")
    assert_one_line_error(r, "truncated WAV")
    assert events.read_bytes() == before


def test_whisper_without_vad_writes_no_transcript_for_silence(tmp_path: Path, speech_models: Path) -> None:
    """An hour of a quiet room gave "you you" transcripts; Whisper's own no-speech rule drops them."""
    room = tmp_path / "room.wav"
    sf.write(room, np.random.default_rng(0).normal(0, 0.01, 45 * SR).astype(np.float32), SR, subtype="PCM_16")
    events = tmp_path / "events.jsonl"
    r = run_cli("run", "--task", "asr", "--model", str(speech_models / "whisper-tiny.en"), "--source", str(room),
                "--sink", f"jsonl://{events}", "--backend", "onnxruntime", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["speech"]["chain"] == ["asr"]
    assert [json.loads(line) for line in events.read_text().splitlines()] == []
    assert summary["speech"]["no_speech_segments"] == 2  # two 30 s windows (30 + 15 s), both taken for silence


def test_a_bad_second_sink_leaves_the_first_ones_output_alone(tmp_path: Path, speech_models: Path) -> None:
    wav = tmp_path / "quiet.wav"
    sf.write(str(wav), np.zeros(SR, np.float32), SR)
    events = tmp_path / "events.jsonl"
    events.write_text('{"type": "segment"}\n' * 10)
    (tmp_path / "blocked").write_text("a file where the second sink wants a folder")
    before = events.read_bytes()
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--source", str(wav),
                "--sink", f"jsonl://{events}", "--sink", f"jsonl://{tmp_path}/blocked/e.jsonl")
    assert_one_line_error(r, "cannot write events here")
    assert events.read_bytes() == before
