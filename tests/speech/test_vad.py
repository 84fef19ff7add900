"""Silero VAD: streaming state and context, hysteresis segments, and the done-when check on a real
LibriVox clip padded with 2 s of silence each side."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgert.errors import ModelError
from edgert.speech import AudioChunk, VoiceActivity, read_audio
from edgert.speech.vad import WINDOW

from ..helpers import tiny_model
from .conftest import silence, speech_edges

SR = 16000


def amplitude_vad(path: Path) -> Path:
    """A model with Silero's interface whose 'probability' is the peak of the 512 new samples."""
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "samples"]),
              helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 128]),
              helper.make_tensor_value_info("sr", TensorProto.INT64, [])]
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1]),
               helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 128])]
    inits = [helper.make_tensor("starts", TensorProto.INT64, [1], [64]),
             helper.make_tensor("ends", TensorProto.INT64, [1], [1 << 30]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
             helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])]
    nodes = [helper.make_node("Slice", ["input", "starts", "ends", "axes"], ["new"]),
             helper.make_node("ReduceMax", ["new"], ["output"], axes=[1], keepdims=1),
             helper.make_node("Add", ["state", "one"], ["stateN"])]
    model = helper.make_model(helper.make_graph(nodes, "amp_vad", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def windows(*runs: tuple[float, int]) -> np.ndarray:
    """Audio whose windows have the given peak values: (value, number of windows) runs."""
    return np.concatenate([np.full(n * WINDOW, v, dtype=np.float32) for v, n in runs])


def stream(vad: VoiceActivity, audio: np.ndarray, chunk: int = WINDOW, name: str = "s") -> list:
    segs = []
    starts = range(0, len(audio), chunk)
    for i, a in enumerate(starts):
        segs += vad.process(AudioChunk(audio[a : a + chunk], a / SR, name, i, last=i == len(starts) - 1))
    return segs


@pytest.fixture()
def amp_vad(tmp_path: Path) -> VoiceActivity:
    return VoiceActivity(amplitude_vad(tmp_path / "amp.onnx"), "onnxruntime", threshold=0.5, neg_threshold=0.35,
                         min_speech_s=0.25, min_silence_s=0.3, pad_s=2 * WINDOW / SR)


def test_hysteresis_short_dips_and_short_bursts(amp_vad: VoiceActivity) -> None:
    audio = windows((0.0, 10), (0.9, 20), (0.4, 3), (0.1, 5), (0.9, 5), (0.1, 20), (0.9, 3), (0.0, 20))
    segs = stream(amp_vad, audio)
    # 0.4 stays above neg_threshold, a 5-window dip (160 ms) is shorter than min_silence: one segment;
    # the closing 3-window burst (96 ms) is shorter than min_speech and dropped.
    assert len(segs) == 1
    seg = segs[0]
    assert seg.start == pytest.approx(8 * WINDOW / SR)  # speech at window 10, minus 2 windows of padding
    assert seg.end == pytest.approx(45 * WINDOW / SR)  # silence from window 43, plus 2 windows
    np.testing.assert_array_equal(seg.audio, audio[8 * WINDOW : 45 * WINDOW])
    assert 0.0 <= seg.probability <= 1.0
    assert amp_vad.session.inputs["state"][0, 0, 0] == amp_vad.windows  # the state came back every call


def test_segment_open_at_the_end_closes_on_flush(amp_vad: VoiceActivity) -> None:
    audio = windows((0.0, 10), (0.9, 20))[:-100]  # ends mid-window, in speech
    segs = stream(amp_vad, audio, chunk=700)
    assert len(segs) == 1 and segs[0].end == pytest.approx(len(audio) / SR)


def test_long_speech_is_cut_at_max_speech(tmp_path: Path) -> None:
    vad = VoiceActivity(amplitude_vad(tmp_path / "amp.onnx"), "onnxruntime", max_speech_s=1.0, pad_s=0.0)
    segs = stream(vad, windows((0.9, 80), (0.0, 40)))
    assert len(segs) == 3 and all(s.duration <= 1.0 + 1e-9 for s in segs)


def test_model_with_unexpected_inputs_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a Silero VAD"):
        VoiceActivity(tiny_model(tmp_path / "t.onnx", (1, 576)), "onnxruntime")


@pytest.mark.parametrize("model", ["silero_vad.onnx", "silero_vad_op18_ifless.onnx"])
def test_padded_librivox_clips_give_one_segment_at_the_speech_edges(speech_models: Path, librivox: Path,
                                                                    model: str) -> None:
    vad = VoiceActivity(speech_models / model, "onnxruntime")
    for clip in sorted(librivox.glob("*.wav")):
        audio = read_audio(clip)
        first, last = speech_edges(audio)
        segs = stream(vad, np.concatenate([silence(2.0), audio, silence(2.0)]), name=clip.name)
        assert len(segs) == 1, (clip.name, [(s.start, s.end) for s in segs])
        assert abs(segs[0].start - (2.0 + first)) <= 0.25, (clip.name, segs[0].start, 2.0 + first)
        assert abs(segs[0].end - (2.0 + last)) <= 0.25, (clip.name, segs[0].end, 2.0 + last)


def test_streaming_does_not_depend_on_chunk_size(speech_models: Path, clip_0930: np.ndarray) -> None:
    vad = VoiceActivity(speech_models / "silero_vad.onnx", "onnxruntime")
    audio = np.concatenate([silence(1.0), clip_0930, silence(1.0), clip_0930, silence(1.0)])
    probs = vad.probabilities(audio)
    results = []
    for chunk in (512, 160, 1000):
        segs = stream(vad, audio, chunk=chunk, name=f"c{chunk}")
        results.append([(s.start, s.end, round(s.probability, 5)) for s in segs])
    assert results[0] == results[1] == results[2] and len(results[0]) == 2
    # The state and context carry: a model reset before every window gives other numbers.
    fresh = []
    for i in range(0, len(audio) - WINDOW, WINDOW):
        vad.reset()
        fresh.append(vad.window_probability(audio[i : i + WINDOW]))
    assert np.abs(np.array(fresh) - probs[: len(fresh)]).max() > 0.1


def test_dropped_audio_keeps_the_clock(amp_vad: VoiceActivity) -> None:
    audio = windows((0.0, 10), (0.9, 20), (0.0, 30))
    chunks = [AudioChunk(audio[a : a + WINDOW], a / SR, "live", i) for i, a in enumerate(range(0, len(audio), WINDOW))]
    del chunks[3:6]  # a live source dropped three chunks before the speech
    segs = []
    for c in chunks:
        segs += amp_vad.process(c)
    assert len(segs) == 1 and segs[0].start == pytest.approx(8 * WINDOW / SR)
    assert len(segs[0].audio) == round((segs[0].end - segs[0].start) * SR)
