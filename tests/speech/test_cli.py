"""``edgert run --task vad|wakeword|asr`` as a user runs it: a subprocess, JSON Lines events, the JSON
summary with the real-time factor and the Whisper share, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ..helpers import assert_one_line_error, run_cli, tiny_model
from .conftest import silence

sf = pytest.importorskip("soundfile")
SR = 16000


@pytest.fixture(scope="module")
def padded_clip(tmp_path_factory: pytest.TempPathFactory, clip_0930: np.ndarray) -> Path:
    path = tmp_path_factory.mktemp("cli") / "padded.wav"
    sf.write(path, np.concatenate([silence(2.0), clip_0930, silence(2.0)]), SR, subtype="PCM_16")
    return path


def test_vad_then_whisper_reports_rtf_and_whisper_share(tmp_path: Path, speech_models: Path,
                                                        padded_clip: Path) -> None:
    config = tmp_path / "speech.yaml"
    vad = speech_models / "silero_vad.onnx"
    config.write_text(f"task: asr\nspeech:\n  chain: [vad, asr]\n  vad:\n    model: {vad}\n    min_silence_s: 0.5\n")
    events = tmp_path / "events.jsonl"
    r = run_cli("run", "--config", str(config), "--model", str(speech_models / "whisper-tiny.en"),
                "--source", str(padded_clip), "--sink", f"jsonl://{events}", "--backend", "onnxruntime", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["speech"]["chain"] == ["vad", "asr"] and summary["task"] == "asr"
    assert summary["speech"]["audio_seconds"] == pytest.approx(7.29, abs=0.01)
    assert 0.3 < summary["speech"]["whisper_share"] < 0.55  # 3.3 s of speech in 7.3 s
    speech = summary["speech"]
    assert speech["rtf"] > 0 and speech["stages"]["asr"]["rtf"] > speech["stages"]["vad"]["rtf"]
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["type"] for e in lines] == ["segment", "transcript"]
    assert "amiable himself" in lines[1]["text"].lower()


def test_beam_search_from_the_command_line(tmp_path: Path, speech_models: Path, librivox: Path) -> None:
    """--decoding beam reaches the Transcriber: the clip greedy gets wrong ("an old-sposed young man") comes out
    right."""
    events = tmp_path / "events.jsonl"
    r = run_cli("run", "--task", "asr", "--model", str(speech_models / "whisper-tiny.en"), "--backend", "onnxruntime",
                "--source", str(librivox / "sense_and_sensibility_01_austen_64kb-0880.wav"), "--decoding", "beam",
                "--fallback", "--sink", f"jsonl://{events}", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    (line,) = [json.loads(line) for line in events.read_text().splitlines()]
    assert line["type"] == "transcript" and "ill-disposed young man" in line["text"].lower(), line["text"]


def test_vad_alone_on_a_folder_to_stdout(speech_models: Path, librivox: Path) -> None:
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--source", str(librivox),
                "--sink", "jsonl://-", "--backend", "onnxruntime")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["type"] for e in events] == ["segment"] * 5
    assert "vad" in r.stderr and "rtf" in r.stderr  # the summary moved to stderr: stdout is the sink


def test_max_frames_stops_early(speech_models: Path, padded_clip: Path) -> None:
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"),
                "--source", str(padded_clip), "--max-frames", "20", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["speech"]["chunks"] == 20 and summary["stopped_by"] == "max_frames"


def test_truncated_wav(tmp_path: Path, speech_models: Path, librivox: Path) -> None:
    data = (librivox / "sense_and_sensibility_01_austen_64kb-0870.wav").read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) // 3])
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--source", str(cut))
    assert_one_line_error(r, "truncated WAV", "cut.wav")


def test_sample_rate_too_low(tmp_path: Path, speech_models: Path) -> None:
    low = tmp_path / "low.wav"
    sf.write(low, np.zeros(4000, dtype=np.float32), 4000, subtype="PCM_16")
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--source", str(low))
    assert_one_line_error(r, "4000 Hz is too low")


def test_other_rates_are_resampled_and_said_so(tmp_path: Path, speech_models: Path) -> None:
    wav = tmp_path / "cd.wav"
    sf.write(wav, np.zeros(44100, dtype=np.float32), 44100, subtype="PCM_16")
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--source", str(wav),
                "--json")
    assert r.returncode == 0, r.stderr
    assert "resampled 44100 Hz" in r.stderr
    assert json.loads(r.stdout)["speech"]["audio_seconds"] == pytest.approx(1.0, abs=0.01)


def test_model_with_unexpected_inputs(tmp_path: Path, padded_clip: Path, speech_models: Path) -> None:
    r = run_cli("run", "--task", "vad", "--model", str(tiny_model(tmp_path / "m.onnx", (1, 576))),
                "--source", str(padded_clip))
    assert_one_line_error(r, "not a Silero VAD", "inputs are x")
    r = run_cli("run", "--task", "asr", "--model", str(speech_models / "silero_vad.onnx"), "--source", str(padded_clip))
    assert_one_line_error(r, "Whisper model is a folder")


def test_missing_microphone(tmp_path: Path, speech_models: Path) -> None:
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--source", "mic://7",
                env={"PATH": str(tmp_path)})  # no arecord on PATH
    assert_one_line_error(r, "mic://7")


def test_config_and_sink_mistakes(tmp_path: Path, speech_models: Path, padded_clip: Path) -> None:
    r = run_cli("run", "--task", "wakeword", "--source", str(padded_clip))
    assert_one_line_error(r, "no model for the wakeword stage")
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--source", str(padded_clip),
                "--sink", str(tmp_path / "out.mp4"))
    assert_one_line_error(r, "out.mp4", "a speech task has none")
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: asr\nspeech:\n  chain: [asr, vad]\n")
    assert_one_line_error(run_cli("run", "--config", str(bad)), "bad.yaml:3", "speech.chain")


def test_wake_and_transcribe_app(tmp_path: Path, speech_models: Path, clip_0930: np.ndarray,
                                 espeak_clips: dict[str, Path]) -> None:
    import subprocess
    import sys

    from edgert.speech import read_audio

    from ..helpers import ROOT

    wav = tmp_path / "ask.wav"
    wake = read_audio(espeak_clips["hey_jarvis"])
    sf.write(wav, np.concatenate([silence(0.5), wake, silence(0.6), clip_0930, silence(0.5)]), SR, subtype="PCM_16")
    r = subprocess.run([sys.executable, str(ROOT / "apps" / "wake_and_transcribe.py"), "--models", str(speech_models),
                        "--source", str(wav), "--backend", "onnxruntime"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wake word hey_jarvis" in r.stdout and "amiable himself" in r.stdout.lower()
    assert "Whisper ran on" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "apps" / "wake_and_transcribe.py"), "--models", str(tmp_path),
                        "--source", str(wav)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "model file not found" in r.stderr
