"""openWakeWord chain: spoken wake words fire (espeak-ng voices), read speech does not, refractory
period, streaming independent of chunk size, models with the wrong inputs refused.

The word models are CC BY-NC-SA 4.0: used here from the assets, never copied into the project."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgert.errors import ModelError
from edgert.speech import AudioChunk, WakeWord, read_audio

from ..helpers import tiny_model
from .conftest import silence

SR = 16000


@pytest.fixture(scope="module")
def words(speech_models: Path) -> WakeWord:
    d = speech_models / "openwakeword"
    return WakeWord([d / "hey_jarvis_v0.1.onnx", d / "alexa_v0.1.onnx"], backend="onnxruntime")


def feed(ww: WakeWord, audio: np.ndarray, chunk: int, name: str) -> list:
    events = []
    for i, a in enumerate(range(0, len(audio), chunk)):
        events += ww.process(AudioChunk(audio[a : a + chunk], a / SR, name, i))
    return events


def test_spoken_wake_words_fire_and_only_their_own(words: WakeWord, espeak_clips: dict[str, Path]) -> None:
    assert words.words == ("hey_jarvis", "alexa")
    for word, path in espeak_clips.items():
        spoken = read_audio(path)  # 22.05 kHz from espeak: resampled on read
        audio = np.concatenate([silence(1.0), spoken, silence(1.0)])
        scores = words.score_audio(audio)
        other = next(w for w in scores if w != word)
        assert scores[word].max() > 0.9, (word, scores[word].max())
        assert scores[other].max() < 0.5, (other, scores[other].max())
        events = feed(words, audio, 512, word)
        assert [e.word for e in events] == [word]  # several steps score high; the refractory keeps one
        assert 1.0 <= events[0].time <= 1.0 + len(spoken) / SR + 0.5


def test_refractory_period(speech_models: Path, espeak_clips: dict[str, Path]) -> None:
    d = speech_models / "openwakeword"
    audio = np.concatenate([silence(1.0), read_audio(espeak_clips["hey_jarvis"]), silence(1.0)])
    eager = WakeWord({"jarvis": d / "hey_jarvis_v0.1.onnx"}, backend="onnxruntime", refractory_s=0.0)
    assert len(feed(eager, audio, 1280, "a")) > 1
    twice = np.concatenate([audio, audio])
    calm = WakeWord({"jarvis": d / "hey_jarvis_v0.1.onnx"}, backend="onnxruntime", refractory_s=1.0)
    fired = feed(calm, twice, 1280, "b")
    assert len(fired) == 2 and fired[1].time - fired[0].time >= 1.0


def test_read_speech_does_not_wake(words: WakeWord, librivox: Path) -> None:
    for clip in sorted(librivox.glob("*.wav"))[1::2]:  # two clips keep it quick; all five stay below 0.01
        assert feed(words, read_audio(clip), 512, clip.name) == [], clip.name


def test_scores_do_not_depend_on_chunk_size(words: WakeWord, clip_0930: np.ndarray) -> None:
    runs = []
    for chunk in (512, 1280, 3000):
        feed(words, clip_0930, chunk, f"c{chunk}")
        runs.append(dict(words.scores))
    assert runs[0] == runs[1] == runs[2]


def test_first_scores_are_held_at_zero(words: WakeWord) -> None:
    scores = words.score_audio(np.random.default_rng(0).normal(0, 0.1, 8 * 1280).astype(np.float32))
    assert (scores["alexa"][:5] == 0).all()


def test_models_with_unexpected_inputs(tmp_path: Path, speech_models: Path) -> None:
    d = speech_models / "openwakeword"
    bad = tiny_model(tmp_path / "bad_word.onnx", (1, 10, 96))
    with pytest.raises(ModelError, match="not an openWakeWord classifier"):
        WakeWord([bad], melspec=d / "melspectrogram.onnx", embedding=d / "embedding_model.onnx", backend="onnxruntime")
    with pytest.raises(ModelError, match="melspectrogram model not found"):
        WakeWord([bad], backend="onnxruntime")
    with pytest.raises(ModelError, match="not openWakeWord's embedding model"):
        WakeWord([d / "alexa_v0.1.onnx"], embedding=d / "melspectrogram.onnx", backend="onnxruntime")
