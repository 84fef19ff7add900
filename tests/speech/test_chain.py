"""The vad -> wakeword -> asr chain through the public API: gating, stats, the Whisper share, and a
live (arecord) source with Whisper on its worker thread."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig, SpeechConfig, VadConfig
from edgert.io.sinks import CallbackSink
from edgert.pipeline import Pipeline
from edgert.speech import (
    AudioChunk,
    SpeechChain,
    SpeechSegment,
    Transcriber,
    Transcript,
    VoiceActivity,
    WakeEvent,
    WakeWord,
    normalize_text,
    read_audio,
)
from edgert.speech.chain import iter_events

from .conftest import fake_arecord, silence

SR = 16000


def chunks(audio: np.ndarray, name: str = "s", size: int = 512) -> list[AudioChunk]:
    starts = list(range(0, len(audio), size))
    return [AudioChunk(audio[a : a + size], a / SR, name, i, last=i == len(starts) - 1) for i, a in enumerate(starts)]


def test_vad_gates_whisper(speech_models: Path, whisper: Transcriber, clip_0930: np.ndarray) -> None:
    audio = np.concatenate([silence(2.0), clip_0930, silence(2.0)])
    chain = SpeechChain(VoiceActivity(speech_models / "silero_vad.onnx", "onnxruntime"), None, whisper)
    events = iter_events(chain, chunks(audio))
    assert [type(e) for e in events] == [SpeechSegment, Transcript]
    seg, text = events
    assert (text.start, text.end) == (seg.start, seg.end)
    assert normalize_text(text.text) == ["he", "might", "even", "have", "been", "made", "amiable", "himself"]
    s = chain.summary()
    assert s["audio_seconds"] == pytest.approx(len(audio) / SR, abs=0.01)
    assert s["whisper_audio_seconds"] == pytest.approx(seg.duration, abs=1e-3)
    assert s["whisper_share"] == pytest.approx(seg.duration / (len(audio) / SR), abs=1e-3) and s["whisper_share"] < 0.5
    assert s["rtf"] > 0 and set(s["stages"]) == {"vad", "asr"} and s["stages"]["asr"]["calls"] == 1


def test_wake_word_gates_whisper(speech_models: Path, whisper: Transcriber, clip_0930: np.ndarray,
                                 espeak_clips: dict[str, Path]) -> None:
    d = speech_models / "openwakeword"
    wake = read_audio(espeak_clips["hey_jarvis"])
    # "hey jarvis" + speech, then, long after the listening window, the same speech without a wake word.
    audio = np.concatenate([silence(1.0), wake, silence(0.2), clip_0930, silence(4.0), clip_0930, silence(1.0)])
    chain = SpeechChain(VoiceActivity(speech_models / "silero_vad.onnx", "onnxruntime"),
                        WakeWord([d / "hey_jarvis_v0.1.onnx"], backend="onnxruntime"), whisper, listen_s=2.0)
    events = iter_events(chain, chunks(audio))
    wakes = [e for e in events if isinstance(e, WakeEvent)]
    texts = [e for e in events if isinstance(e, Transcript)]
    segs = [e for e in events if isinstance(e, SpeechSegment)]
    assert [w.word for w in wakes] == ["hey_jarvis"] and 1.0 < wakes[0].time < 1.0 + len(wake) / SR + 0.5
    # Transcribed: the segment holding the wake word and the one starting within listen_s after it;
    # the last utterance, 4 s later, is not.
    assert len(segs) == 3 and [t.start for t in texts] == [segs[0].start, segs[1].start]
    assert "amiable himself" in " ".join(normalize_text(texts[-1].text))
    s = chain.summary()
    assert s["skipped_segments"] >= 1 and s["wake_events"] == 1
    # The wake word model listened only while the VAD heard speech (plus pre-roll), not to the silences.
    assert s["stages"]["wakeword"]["audio_seconds"] < 0.8 * s["audio_seconds"]


def test_live_source_runs_whisper_on_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              speech_models: Path, whisper: Transcriber,
                                              clip_0930: np.ndarray) -> None:
    sf = pytest.importorskip("soundfile")
    wav = tmp_path / "mic.wav"
    audio = np.concatenate([silence(1.0), clip_0930, silence(1.5)])
    sf.write(wav, audio, SR, subtype="PCM_16")
    monkeypatch.setenv("PATH", f"{fake_arecord(tmp_path / 'bin', wav)}{os.pathsep}{os.environ['PATH']}")
    got: list[dict[str, object]] = []
    config = PipelineConfig(task="asr", model=ModelConfig(path=str(speech_models / "whisper-tiny.en"),
                                                          backend="onnxruntime"),
                            source=SourceConfig(uri="alsa://default?via=arecord&queue_s=30"),
                            speech=SpeechConfig(chain=("vad", "asr"),
                                                vad=VadConfig(model=str(speech_models / "silero_vad.onnx"))),
                            runtime=RuntimeConfig(max_frames=len(audio) // 512))
    pipeline = Pipeline(config, sinks=[CallbackSink(lambda r: got.extend(r.events), queue_size=4096)],
                        handle_signals=False, environment=False)
    summary = pipeline.run()
    texts = [e for e in got if e["type"] == "transcript"]
    assert len(texts) == 1 and "amiable" in str(texts[0]["text"]).lower()
    # Whisper ran on its worker (the source is live) and its transcript still reached the sink at the end.
    assert summary["stopped_by"] == "max_frames" and summary["dropped"] == 0
    assert summary["source"]["kind"] == "audio-live" and summary["source"]["overruns"] == 0
    assert 0 < summary["speech"]["whisper_share"] < 0.7


def test_chain_needs_a_stage_and_vad_between_wakeword_and_asr(speech_models: Path, whisper: Transcriber) -> None:
    from edgert.errors import ConfigError

    with pytest.raises(ConfigError, match="no stage"):
        SpeechChain()
    d = speech_models / "openwakeword"
    with pytest.raises(ConfigError, match="add a VAD stage"):
        SpeechChain(None, WakeWord([d / "alexa_v0.1.onnx"], backend="onnxruntime"), whisper)
