"""openai-whisper's token search (edgert.speech.decoding) on tiny real ONNX decoders built here, run
through the exact decoder of the Transcriber (split, batched): beam search finds the sequence greedy
misses, batched beams equal beams one by one, and the temperature fallback fires on a repetitive output
and not on silence."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgert.speech.decoding import (
    FALLBACK_TEMPERATURES,
    Decoded,
    beam_search,
    decode_with_fallback,
    greedy,
    log_softmax,
    rank,
    sample,
)
from edgert.speech.whisper_decoders import _ExactOrtDecoder

pytest.importorskip("onnxruntime")

START, EOT = 0, 7
WORDS = {1: "park", 2: "after", 3: "lunch", 4: "dinner", 5: "parcafter", 6: "hello"}


def bigram_decoder(path: Path, probs: dict[int, dict[int, float]], vocab: int = 8, mix: bool = False) -> Path:
    """A Whisper-shaped decoder: ``tokens`` int64 [1, n] + ``encoder_out`` [1, 4, 2] -> ``logits``.

    The next-token distribution depends on the last token alone (row ``t`` of a table, ``probs[t]``, the rest
    of the row at 1e-6), through a MatMul projection as in the real decoder. ``encoder_out`` adds its mean
    (0 for the zeros fed here), which the split hoists as the real cross-attention is. Like the real export,
    the batch axis is declared 1 and the logits are reshaped to [1, n, -1] at the end. ``mix``: the logits
    are laid out position-major before that reshape, right for one sequence, scrambled for several.
    """
    table = np.full((vocab, vocab), 1e-6, dtype=np.float64)
    for row, dist in probs.items():
        for tok, p in dist.items():
            table[row, tok] = p
    logits = np.log(table / table.sum(axis=1, keepdims=True)).astype(np.float32)
    nodes = [  # one-hot "embedding" of each token, plus the audio, projected onto the vocabulary by the table
        helper.make_node("Min", ["tokens", "top"], ["clipped"]),  # the bucketed decoder pads with Whisper's end id
        helper.make_node("Gather", ["eye", "clipped"], ["onehot"], axis=0),
        helper.make_node("ReduceMean", ["encoder_out"], ["audio_mean"], axes=[1, 2], keepdims=1),
        helper.make_node("Add", ["onehot", "audio_mean"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "table"], ["projected" if mix else "raw"]),
        *([helper.make_node("Transpose", ["projected"], ["raw"], perm=[1, 0, 2])] if mix else []),
        helper.make_node("Shape", ["tokens"], ["tshape"]),
        helper.make_node("Gather", ["tshape", "one"], ["n"], axis=0),
        helper.make_node("Concat", ["batch1", "n", "minus1"], ["oshape"], axis=0),
        helper.make_node("Reshape", ["raw", "oshape"], ["logits"]),
    ]
    inits = [
        helper.make_tensor("table", TensorProto.FLOAT, list(logits.shape), logits.ravel().tolist()),
        helper.make_tensor("eye", TensorProto.FLOAT, [vocab, vocab], np.eye(vocab).ravel().tolist()),
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("top", TensorProto.INT64, [], [vocab - 1]),
        helper.make_tensor("batch1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("minus1", TensorProto.INT64, [1], [-1]),
    ]
    graph = helper.make_graph(
        nodes, "bigram_decoder",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "n_tokens"]),
         helper.make_tensor_value_info("encoder_out", TensorProto.FLOAT, [1, 4, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n_tokens", vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


#: Greedy takes "park" (0.55), then the flat row after it ("after" 0.27): -0.96 a token. The best sequence
#: is "parcafter" (0.45) and the end (0.95): -0.85 a token, which only a search that keeps two prefixes finds.
MERGE = {
    START: {1: 0.55, 5: 0.45},
    1: {2: 0.27, 4: 0.25, EOT: 0.24, 3: 0.2},
    2: {EOT: 0.99},
    3: {EOT: 0.99},
    4: {EOT: 0.99},
    5: {EOT: 0.95, 6: 0.04},
    6: {EOT: 0.99},
}

#: "hello park hello park ...": each step 0.5 to the other word, 0.3 to the end; greedy never ends.
LOOP = {START: {6: 0.6, 1: 0.4}, 6: {1: 0.5, EOT: 0.3, 2: 0.2}, 1: {6: 0.5, EOT: 0.3, 3: 0.2},
        2: {EOT: 0.9}, 3: {EOT: 0.9}}


@pytest.fixture()
def merge_decoder(tmp_path: Path) -> Iterator[_ExactOrtDecoder]:
    dec = _ExactOrtDecoder(bigram_decoder(tmp_path / "merge.onnx", MERGE), threads=1)
    dec.set_encoder_out(np.zeros((1, 4, 2), dtype=np.float32))
    yield dec
    dec.close()


def step_of(dec: Any) -> Callable[[np.ndarray], np.ndarray]:
    def step(tokens: np.ndarray) -> np.ndarray:
        return log_softmax(dec.last_logits(tokens))
    return step


def best_by_enumeration(probs: dict[int, dict[int, float]], max_len: int = 3) -> tuple[int, ...]:
    """The sequence with the highest sum log-probability over length, by trying every one up to max_len."""
    logp = {row: {t: np.log(p / (sum(d.values()) + 1e-6 * (8 - len(d)))) for t, p in d.items()}
            for row, d in probs.items()}
    best, best_score = (), -np.inf
    for length in range(1, max_len + 1):
        for seq in itertools.product(WORDS, repeat=length):
            total, prev = 0.0, START
            for tok in (*seq, EOT):
                total += logp.get(prev, {}).get(tok, np.log(1e-6))
                prev = tok
            if total / length > best_score:
                best, best_score = seq, total / length
    return best


def test_beam_search_finds_what_greedy_misses(merge_decoder: _ExactOrtDecoder) -> None:
    step = step_of(merge_decoder)
    best = best_by_enumeration(MERGE)
    g = greedy(step, [START], EOT, max_tokens=10)
    beams = beam_search(step, [START], EOT, max_tokens=10, beam_size=5)
    chosen = rank(beams)
    assert chosen.tokens == best and chosen.finished
    assert g.tokens != best  # the case discriminates: greedy ends elsewhere
    assert [WORDS[t] for t in g.tokens] == ["park", "after"]
    assert len(beams) == 5 and all(c.finished for c in beams)  # patience 1: stop at beam_size finished
    assert merge_decoder.batched is True  # the beams ran as one batch through the split decoder
    assert merge_decoder._last_ok is True  # and the projection ran at the last position only


def test_batched_beams_equal_beams_one_by_one(tmp_path: Path, merge_decoder: _ExactOrtDecoder) -> None:
    tokens = np.array([[START, 1, 2], [START, 5, 6], [START, 1, 4]], dtype=np.int64)
    together = merge_decoder.last_logits(tokens)
    rows = np.stack([merge_decoder.logits(tokens[i : i + 1], 3)[-1] for i in range(3)])
    np.testing.assert_allclose(together, rows, atol=1e-6)
    batched = beam_search(step_of(merge_decoder), [START], EOT, 10, beam_size=3, patience=2.0)
    merge_decoder.batched = False
    one_by_one = beam_search(step_of(merge_decoder), [START], EOT, 10, beam_size=3, patience=2.0)
    assert batched == one_by_one and len(batched) == 6  # patience 2: twice beam_size finished candidates


def test_an_export_that_cannot_batch_runs_beams_one_by_one(tmp_path: Path,
                                                           merge_decoder: _ExactOrtDecoder) -> None:
    mixed = _ExactOrtDecoder(bigram_decoder(tmp_path / "mixed.onnx", MERGE, mix=True), threads=1)
    mixed.set_encoder_out(np.zeros((1, 4, 2), dtype=np.float32))
    try:
        beams = beam_search(step_of(mixed), [START], EOT, 10, beam_size=5)
        assert mixed.batched is False  # the first batched call disagreed with one-by-one runs and was dropped
    finally:
        mixed.close()
    assert beams == beam_search(step_of(merge_decoder), [START], EOT, 10, beam_size=5)


def test_beam_cut_at_max_tokens_keeps_the_best_live(tmp_path: Path) -> None:
    dec = _ExactOrtDecoder(bigram_decoder(tmp_path / "loop.onnx", LOOP), threads=1)
    dec.set_encoder_out(np.zeros((1, 4, 2), dtype=np.float32))
    try:
        cands = beam_search(step_of(dec), [START], EOT, max_tokens=1, beam_size=2)
    finally:
        dec.close()
    assert [c.tokens for c in cands] == [(6,), (1,)] and not any(c.finished for c in cands)


def test_length_penalty_ranks_as_google_nmt() -> None:
    from edgert.speech.decoding import Candidate

    short = Candidate((1,), -1.0, True)
    long = Candidate((1, 2, 3, 4), -1.4, True)
    assert rank([short, long]) == long  # None: -0.35 a token beats -1.0
    assert rank([short, long], length_penalty=0.0) == short  # alpha 0: the plain sum, -1.0 beats -1.4
    assert rank([short, long], length_penalty=1.0) == long  # -1.4 / ((5 + 4) / 6) beats -1.0 / ((5 + 1) / 6)


def loop_attempts(tmp_path: Path, no_speech_prob: float = 0.0,
                  temperatures: tuple[float, ...] = FALLBACK_TEMPERATURES) -> list[Decoded]:
    dec = _ExactOrtDecoder(bigram_decoder(tmp_path / "loop.onnx", LOOP), threads=1)
    dec.set_encoder_out(np.zeros((1, 4, 2), dtype=np.float32))
    step = step_of(dec)
    rng = np.random.default_rng(0)

    def attempt(t: float) -> Decoded:
        # greedy at 0, as openai-whisper's transcribe() by default (beams would end: 0.3 each step)
        best = greedy(step, [START], EOT, 40) if t == 0 else rank(sample(step, [START], EOT, 40, t, 5, rng))
        return Decoded(best.tokens, best.sum_logprob, best.finished, t,
                       " ".join(WORDS[x] for x in best.tokens), no_speech_prob)

    try:
        return decode_with_fallback(attempt, temperatures)
    finally:
        dec.close()


def test_fallback_fires_on_a_repetitive_output(tmp_path: Path) -> None:
    tried = loop_attempts(tmp_path)
    first = tried[0]
    assert first.temperature == 0.0 and not first.finished  # greedy loops "hello park" up to max_tokens
    assert first.compression_ratio > 2.4 and first.avg_logprob > -1.0  # repetition alone triggers it
    assert len(tried) > 1 and tried[1].temperature == 0.2
    for d in tried[:-1]:  # every attempt but the kept one failed the rule
        assert d.compression_ratio > 2.4 or d.avg_logprob < -1.0
    last = tried[-1]
    assert last.temperature == 1.0 or (last.compression_ratio <= 2.4 and last.avg_logprob >= -1.0)
    assert last.compression_ratio < first.compression_ratio
    # one temperature: no fallback, the loop is kept
    assert [d.temperature for d in loop_attempts(tmp_path, temperatures=(0.0,))] == [0.0]


def test_no_fallback_on_silence(tmp_path: Path) -> None:
    """A window taken for silence (no-speech probability > 0.6, mean log-probability < -1) is not retried."""
    from edgert.speech.decoding import Candidate

    calls: list[float] = []

    def attempt(t: float) -> Decoded:
        calls.append(t)
        c = Candidate((6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6), -20.0, True)
        return Decoded(c.tokens, c.sum_logprob, True, t, " ".join(["hello"] * 12), 0.9)

    assert len(decode_with_fallback(attempt, FALLBACK_TEMPERATURES)) == 1
    assert calls == [0.0]
    # the same window with speech in it (no-speech probability 0.1) goes through every temperature
    calls.clear()

    def speech(t: float) -> Decoded:
        d = attempt(t)
        return Decoded(d.tokens, d.sum_logprob, d.finished, t, d.text, 0.1)

    assert [d.temperature for d in decode_with_fallback(speech, FALLBACK_TEMPERATURES)] == list(FALLBACK_TEMPERATURES)


def test_fallback_schedule_matches_the_cli_flag() -> None:
    from edgert.cli.run_flags import FALLBACK_TEMPERATURES as _FALLBACK

    assert _FALLBACK == FALLBACK_TEMPERATURES


def test_bucketed_decoder_runs_beams_row_by_row(tmp_path: Path, merge_decoder: _ExactOrtDecoder) -> None:
    """Fixed [1, 16] Sessions: each row's logits are copied out before the next run reuses the buffer."""
    from edgert.speech.whisper_decoders import _BucketedDecoder

    bucketed = _BucketedDecoder(bigram_decoder(tmp_path / "fixed.onnx", MERGE), "onnxruntime", 1)
    bucketed.set_encoder_out(np.zeros((1, 4, 2), dtype=np.float32))
    try:
        tokens = np.array([[START, 1], [START, 5], [START, 2]], dtype=np.int64)
        np.testing.assert_allclose(bucketed.last_logits(tokens), merge_decoder.last_logits(tokens), atol=1e-5)
        assert beam_search(step_of(bucketed), [START], EOT, 10) == beam_search(step_of(merge_decoder), [START], EOT, 10)
    finally:
        bucketed.close()
