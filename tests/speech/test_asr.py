"""Whisper tiny.en: greedy decoding on a real clip, the bucketed (fixed-shape) decoder agreeing with
the exact-length one, and clear errors for model folders that are not Whisper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgert.errors import InputError, ModelError
from edgert.speech import SpeechSegment, Transcriber, Transcript, normalize_text, wer

from ..helpers import tiny_model


def test_transcribes_a_real_clip(whisper: Transcriber, clip_0930: np.ndarray) -> None:
    t = whisper.transcribe(clip_0930, start=1.5, stream="clip")
    assert normalize_text(t.text) == ["he", "might", "even", "have", "been", "made", "amiable", "himself"]
    assert t.start == 1.5 and t.end == pytest.approx(1.5 + len(clip_0930) / 16000)
    assert not t.truncated and t.tokens and all(tok < 50256 for tok in t.tokens)
    assert whisper.decoder_mode == "exact"


def test_segment_times_are_kept(whisper: Transcriber, clip_0930: np.ndarray) -> None:
    seg = SpeechSegment(start=4.0, end=7.29, probability=0.9, stream="s", audio=clip_0930)
    t = whisper.transcribe_segment(seg)
    assert (t.start, t.end, t.stream) == (4.0, 7.29, "s")
    with pytest.raises(InputError, match="no audio"):
        whisper.transcribe_segment(SpeechSegment(start=0.0, end=1.0, probability=0.5))


def test_bucketed_decoder_matches_the_exact_one(speech_models: Path, whisper: Transcriber,
                                               clip_0930: np.ndarray) -> None:
    """Fixed-shape Sessions with padded tokens give the exact-length logits: the decoder is causal."""
    from edgert.speech.whisper_decoders import _BucketedDecoder

    whisper.transcribe(clip_0930)
    tokens = np.zeros((1, 20), dtype=np.int64)
    tokens[0, :7] = [50257, 50362, 679, 1244, 772, 423, 587]
    exact = whisper._decoder
    bucketed = _BucketedDecoder(speech_models / "whisper-tiny.en" / "decoder.onnx", "onnxruntime", 0)
    try:
        encoder_out = whisper.encoder.outputs["encoder_out"]
        exact.set_encoder_out(encoder_out)
        bucketed.set_encoder_out(encoder_out)
        for n in (2, 7):
            a, b = exact.logits(tokens, n)[n - 1], bucketed.logits(tokens, n)[n - 1]
            assert a.argmax() == b.argmax()
            np.testing.assert_allclose(a, b, atol=2e-3)
        beams = np.array([[50257, 50362, 679, 1244], [50257, 50362, 679, 373]], dtype=np.int64)
        np.testing.assert_allclose(bucketed.last_logits(beams), exact.last_logits(beams), atol=2e-3)  # row by row
    finally:
        bucketed.close()


def test_max_tokens_marks_truncation(whisper: Transcriber, clip_0930: np.ndarray) -> None:
    whisper.max_tokens = 3
    try:
        t = whisper.transcribe(clip_0930)
    finally:
        whisper.max_tokens = 224
    assert t.truncated and len(t.tokens) == 3


def test_noise_is_taken_for_silence(whisper: Transcriber, clip_0930: np.ndarray) -> None:
    """Whisper's own rule: high no-speech probability and low confidence drop the (hallucinated) text."""
    noise = np.random.default_rng(0).normal(0, 0.01, 32000).astype(np.float32)
    t = whisper.transcribe(noise)
    assert t.no_speech and t.text == "" and t.no_speech_prob is not None and t.no_speech_prob > 0.6
    speech = whisper.transcribe(clip_0930)
    assert not speech.no_speech and speech.no_speech_prob is not None and speech.no_speech_prob < 0.1
    assert speech.avg_logprob is not None and -0.5 < speech.avg_logprob < 0
    whisper.no_speech_threshold = None
    try:
        assert not whisper.transcribe(noise).no_speech
    finally:
        whisper.no_speech_threshold = 0.6


def test_wrong_input_dtype(whisper: Transcriber) -> None:
    with pytest.raises(InputError, match="float32"):
        whisper.transcribe(np.zeros(16000, dtype=np.int16))


def test_model_folders_that_are_not_whisper(tmp_path: Path, speech_models: Path) -> None:
    with pytest.raises(ModelError, match=r"is a folder holding encoder\.onnx"):
        Transcriber(speech_models / "silero_vad.onnx")
    with pytest.raises(ModelError, match=r"lacks decoder\.onnx, tokenizer\.json"):
        tiny_model(tmp_path / "encoder.onnx")
        Transcriber(tmp_path)
    # An encoder with the wrong inputs, next to the real decoder and tokenizer (linked, not copied).
    fake = tmp_path / "fake"
    fake.mkdir()
    tiny_model(fake / "encoder.onnx", (1, 3, 8, 8))
    for name in ("decoder.onnx", "tokenizer.json"):
        (fake / name).symlink_to(speech_models / "whisper-tiny.en" / name)
    with pytest.raises(ModelError, match="not a Whisper encoder"):
        Transcriber(fake, "onnxruntime")


def test_results_validate_themselves() -> None:
    with pytest.raises(ValueError, match="start <= end"):
        Transcript(text="x", start=2.0, end=1.0)
    with pytest.raises(ValueError, match="probability"):
        SpeechSegment(start=0.0, end=1.0, probability=1.5)
    assert wer(["a b c d"], ["a x c"]) == 0.5
    assert normalize_text("Cold-hearted, Mr. O'Brien!") == ["cold", "hearted", "mr", "o'brien"]


def test_split_decoder_hoists_only_the_audio_part(tmp_path: Path) -> None:
    """A toy decoder: logits = (emb[tokens] @ (enc @ W)^T).sum; the split runs the same arithmetic."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from edgert.speech.decoder_split import split_decoder

    rng = np.random.default_rng(0)
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [10, 4], rng.normal(size=40).astype(np.float32).ravel())
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], rng.normal(size=16).astype(np.float32).ravel())
    nodes = [helper.make_node("MatMul", ["encoder_out", "w"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("Gather", ["emb", "tokens"], ["x"]),
             helper.make_node("MatMul", ["x", "kt"], ["logits"])]
    graph = helper.make_graph(
        nodes, "toy", [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "n"]),
                       helper.make_tensor_value_info("encoder_out", TensorProto.FLOAT, [1, 6, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", 6])], [emb, w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    split = split_decoder(model)
    assert split is not None
    cross, step, hoisted = split
    assert hoisted == ["kt"] and [n.op_type for n in cross.graph.node] == ["MatMul", "Transpose"]
    assert [n.op_type for n in step.graph.node] == ["Gather", "MatMul"]

    def run(m: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)

    tokens = np.array([[1, 5, 7]], dtype=np.int64)
    enc = rng.normal(size=(1, 6, 4)).astype(np.float32)
    (kt,) = run(cross, {"encoder_out": enc})
    np.testing.assert_array_equal(run(step, {"tokens": tokens, "kt": kt})[0],
                                  run(model, {"tokens": tokens, "encoder_out": enc})[0])
    # Nothing depends on the audio alone: nothing to hoist.
    del model.graph.node[:]
    model.graph.node.extend([nodes[2], helper.make_node("Add", ["x", "encoder_out"], ["kt"]), nodes[3]])
    assert split_decoder(model) is None


@pytest.fixture(scope="session")
def clip_0880(librivox: Path) -> np.ndarray:
    """'he was not an ill disposed young man' (3.0 s): greedy hears 'an old-sposed young man'."""
    pytest.importorskip("soundfile")
    from edgert.speech import read_audio

    return read_audio(librivox / "sense_and_sensibility_01_austen_64kb-0880.wav")


def test_beam_search_transcribes_a_librivox_clip(whisper: Transcriber, clip_0880: np.ndarray) -> None:
    """openai-whisper's beam search (5 beams) gets the clip right where greedy merges 'ill disposed'."""
    ref = ["he", "was", "not", "an", "ill", "disposed", "young", "man"]
    greedy = whisper.transcribe(clip_0880)
    whisper.decoding = "beam"
    try:
        beam = whisper.transcribe(clip_0880)
    finally:
        whisper.decoding = "greedy"
    assert normalize_text(beam.text) == ref, beam.text
    assert normalize_text(greedy.text) != ref, greedy.text  # the clip tells the two apart
    assert not beam.truncated and not beam.no_speech
    assert beam.avg_logprob is not None and greedy.avg_logprob is not None
    assert beam.avg_logprob > greedy.avg_logprob  # the beam's choice is the more probable text
    assert whisper._decoder.batched is True  # type: ignore[attr-defined]  # five beams, one decoder call


def test_real_decoder_runs_beams_as_one_batch(whisper: Transcriber, clip_0930: np.ndarray) -> None:
    whisper.transcribe(clip_0930)  # sets the window's encoder output
    tokens = np.array([[50257, 50362, 679, 1244, 772], [50257, 50362, 679, 373, 407],
                       [50257, 50362, 1375, 1244, 772]], dtype=np.int64)
    together = whisper._decoder.last_logits(tokens)
    rows = np.stack([whisper._decoder.logits(tokens[i : i + 1], 5)[-1] for i in range(3)])
    assert together.shape == (3, rows.shape[1])
    np.testing.assert_allclose(together, rows, atol=1e-3)
    assert (together.argmax(axis=1) == rows.argmax(axis=1)).all()
    # both shortcuts checked out and are used: one batch, and the vocabulary projection at the last position only
    assert whisper._decoder.batched is True and whisper._decoder._last_ok is True  # type: ignore[attr-defined]


def test_config_search_keys_are_transcriber_arguments() -> None:
    import inspect

    from edgert.config import AsrConfig

    params = inspect.signature(Transcriber.__init__).parameters
    assert set(AsrConfig(decoding="beam").search()) <= set(params)
    with pytest.raises(InputError, match="temperature 0"):
        Transcriber._check_search("beam", 5, None, None, (0.2,), 5)


def test_long_audio_is_conditioned_on_the_previous_window(whisper: Transcriber, librivox: Path) -> None:
    """Over 30 s: the second window is prompted with the first one's text (condition_on_previous_text, as the
    reference's transcribe), and each window is a segment with its own times in the transcript's events."""
    from edgert.speech import read_audio

    clips = sorted(librivox.glob("*.wav"))
    gap = np.zeros(4800, np.float32)
    audio = np.concatenate([np.concatenate([read_audio(c), gap]) for c in clips] * 2)  # 52 s
    before = whisper.stats.get("prompted_windows", 0)
    t = whisper.transcribe(audio, start=10.0)
    assert whisper.stats["prompted_windows"] == before + 1  # the second window of two
    assert len(whisper.next_prompt) > 20 and all(tok < 50256 for tok in whisper.next_prompt)
    events = t.to_dict()["segments"]
    assert [(s["start"], s["end"]) for s in events] == [(10.0, 40.0), (40.0, round(10.0 + len(audio) / 16000, 3))]
    assert "amiable himself" in " ".join(normalize_text(" ".join(s["text"] for s in events)))
    whisper.condition_on_previous_text = False
    try:
        before = whisper.stats["prompted_windows"]
        whisper.transcribe(audio)
        assert whisper.stats["prompted_windows"] == before  # off: windows decoded independently
    finally:
        whisper.condition_on_previous_text = True


def test_a_fork_shares_the_model_and_transcribes_as_the_original(whisper: Transcriber, clip_0930: np.ndarray,
                                                                 librivox: Path) -> None:
    """Two sources of one run share one Whisper: forks on the same ONNX Runtime sessions, each with its own
    window state, give the same transcripts side by side in two threads as the original gives one at a time."""
    import threading

    from edgert.speech import read_audio

    other = read_audio(librivox / "sense_and_sensibility_01_austen_64kb-0880.wav")
    alone = [whisper.transcribe(clip_0930).tokens, whisper.transcribe(other).tokens]
    a, b = whisper.fork(), whisper.fork()
    try:
        assert a._decoder._step is whisper._decoder._step  # type: ignore[attr-defined]  # one model in memory
        assert a.encoder._sess is whisper.encoder._sess  # type: ignore[attr-defined]
        assert a.encoder.inputs is not whisper.encoder.inputs  # buffers of its own
        got: dict[str, list[tuple[int, ...]]] = {"a": [], "b": []}

        def work(name: str, asr: Transcriber, clips: list[np.ndarray]) -> None:
            for _ in range(2):
                for clip in clips:
                    got[name].append(asr.transcribe(clip).tokens)

        threads = [threading.Thread(target=work, args=("a", a, [clip_0930, other])),
                   threading.Thread(target=work, args=("b", b, [other, clip_0930]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got["a"] == alone * 2
        assert got["b"] == alone[::-1] * 2
        assert a.stats["windows"] == 4 and whisper.stats["windows"] >= 2  # statistics of its own
    finally:
        a.close()
        b.close()
    assert whisper.transcribe(clip_0930).tokens == alone[0]  # closing a fork leaves the original working


def test_auto_decoding_on_the_cpu_is_the_cpu_choice(speech_models: Path) -> None:
    from edgert.search_rules import AUTO_CPU

    with Transcriber(speech_models / "whisper-tiny.en", backend="onnxruntime", decoding="auto") as asr:
        assert (asr.decoding, asr.beam_size, asr.auto_device) == (*AUTO_CPU, "cpu")
    with pytest.raises(InputError, match="decoding: expected auto, greedy or beam"):
        Transcriber._check_search("beams", 5, None, None, (0.0,), 5)
