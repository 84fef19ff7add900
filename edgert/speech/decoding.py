"""Whisper's token search as openai-whisper's ``transcribe`` does it: greedy, beam search, best-of-N
sampling, the ranking of candidates and the temperature fallback.

Written here by hand, following ``whisper/decoding.py`` (``GreedyDecoder``, ``BeamSearchDecoder``,
``MaximumLikelihoodRanker``) and ``whisper/transcribe.py`` (``decode_with_fallback``) of openai-whisper
20250625: that package needs PyTorch (hundreds of MB, no wheel for every JetPack) and runs its own model,
not our ONNX decoder; the search itself is a few dozen lines over numpy. Hugging Face's generate and
ONNX Runtime's BeamSearch op need models exported their way (a KV cache, their graph layout), which the
Whisper folders here are not.

The search sees the model through ``step``: tokens int64 [B, n] (B sequences of one length) ->
log-probabilities [B, vocab] of the next token, with the suppression rules already applied. B > 1 is
one batched decoder call where the decoder allows it (:class:`edgert.speech.asr.Transcriber` says which).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable  # the alias below is evaluated at run time: collections.abc's is 3.9+

import numpy as np

from edgert.search_rules import at_least_one, patience_problem

__all__ = [
    "FALLBACK_TEMPERATURES",
    "Candidate",
    "Decoded",
    "beam_search",
    "compression_ratio",
    "decode_with_fallback",
    "greedy",
    "log_softmax",
    "rank",
    "sample",
]

#: openai-whisper's ``transcribe`` default: 0.0, then 0.2 steps up to 1.0.
FALLBACK_TEMPERATURES: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)

Step = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Candidate:
    """One finished (or cut) sequence: its text tokens (no start tokens, no end token)."""

    tokens: tuple[int, ...]
    sum_logprob: float  # the end token's log-probability included when it ended
    finished: bool  # ended with the end token (False: cut at max_tokens)


@dataclass(frozen=True)
class Decoded:
    """What one attempt at one window gave: the chosen candidate and the figures the fallback reads."""

    tokens: tuple[int, ...]
    sum_logprob: float
    finished: bool
    temperature: float
    text: str
    no_speech_prob: float = 0.0

    @property
    def avg_logprob(self) -> float:
        """openai-whisper's ``avg_logprob``: sum over the tokens and the end token, over their count."""
        return self.sum_logprob / (len(self.tokens) + 1)

    @property
    def compression_ratio(self) -> float:
        return compression_ratio(self.text)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities along the last axis; -inf logits (suppressed tokens) stay -inf."""
    x = logits.astype(np.float32, copy=False)
    m = np.max(x, axis=-1, keepdims=True)
    shifted = x - m
    out: np.ndarray = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return out


def compression_ratio(text: str) -> float:
    """openai-whisper's repetition measure: UTF-8 bytes over zlib-compressed bytes (above 2.4: a loop)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def greedy(step: Step, initial: Sequence[int], eot: int, max_tokens: int) -> Candidate:
    """The most probable token each step (``GreedyDecoder`` at temperature 0)."""
    tokens = np.array([list(initial)], dtype=np.int64)
    out: list[int] = []
    total = 0.0
    for _ in range(max_tokens):
        logprobs = step(tokens)[0]
        token = int(np.argmax(logprobs))
        total += float(logprobs[token])
        if token == eot:
            return Candidate(tuple(out), total, True)
        out.append(token)
        tokens = np.concatenate([tokens, np.array([[token]], dtype=np.int64)], axis=1)
    return Candidate(tuple(out), total, False)


def beam_search(step: Step, initial: Sequence[int], eot: int, max_tokens: int, beam_size: int = 5,
                patience: float | None = None) -> list[Candidate]:
    """``BeamSearchDecoder``: ``beam_size`` live sequences, each extended by its ``beam_size + 1`` best tokens.

    Sequences that end go to the finished list (best first) until it holds ``round(beam_size * patience)``;
    then the search stops. If max_tokens comes first, the best live sequences fill the list up to
    ``beam_size`` as cut candidates. The reference starts from ``beam_size`` copies of the start tokens,
    whose candidates coincide; one copy gives the same candidates with one row instead of five.
    """
    problem = at_least_one(beam_size) or patience_problem(patience, beam_size)
    if problem is not None:
        raise ValueError(f"beam search: {problem}")
    max_candidates = round(beam_size * (patience or 1.0))
    start = len(initial)
    live: list[tuple[tuple[int, ...], float]] = [(tuple(initial), 0.0)]
    finished: dict[tuple[int, ...], float] = {}
    k = beam_size + 1
    for _ in range(max_tokens):
        logprobs = step(np.array([seq for seq, _ in live], dtype=np.int64))
        scores: dict[tuple[int, ...], float] = {}
        for row, (seq, total) in enumerate(live):
            lp = logprobs[row]
            top = np.argpartition(-lp, k - 1)[:k] if lp.shape[0] > k else np.arange(lp.shape[0])
            for token in sorted(top.tolist(), key=lambda t: (-float(lp[t]), t)):  # topk order, ties by id
                scores[(*seq, int(token))] = total + float(lp[token])
        new_live: list[tuple[tuple[int, ...], float]] = []
        ended: dict[tuple[int, ...], float] = {}
        for seq in sorted(scores, key=lambda s: scores[s], reverse=True):  # stable: ties keep topk order
            if seq[-1] == eot:
                ended[seq] = scores[seq]
            else:
                new_live.append((seq, scores[seq]))
                if len(new_live) == beam_size:
                    break
        for seq in sorted(ended, key=lambda s: ended[s], reverse=True):
            if len(finished) >= max_candidates:
                break
            finished[seq] = ended[seq]
        live = new_live
        if len(finished) >= max_candidates or not live:
            break
    out = [Candidate(seq[start:-1], total, True) for seq, total in finished.items()]
    if len(out) < beam_size:  # not enough ended: the best live ones, cut where they stand
        for seq, total in sorted(live, key=lambda x: x[1], reverse=True):
            out.append(Candidate(seq[start:], total, False))
            if len(out) >= beam_size:
                break
    return out


def sample(step: Step, initial: Sequence[int], eot: int, max_tokens: int, temperature: float, best_of: int,
           rng: np.random.Generator) -> list[Candidate]:
    """``best_of`` independent samples at ``temperature`` (``GreedyDecoder`` at T > 0), one batched row each.

    The sampled token comes from softmax(logits / T) (drawn with the Gumbel-max trick, which is the same
    distribution); the sum adds the token's log-probability at T = 1, as the reference does. A sequence that
    has ended leaves the batch: the decoder is causal, so the others' logits do not change.
    """
    if temperature <= 0:
        raise ValueError(f"sampling needs a temperature > 0, got {temperature}")
    seqs = [list(initial) for _ in range(best_of)]
    totals = [0.0] * best_of
    done = [False] * best_of
    for _ in range(max_tokens):
        active = [i for i in range(best_of) if not done[i]]
        if not active:
            break
        logprobs = step(np.array([seqs[i] for i in active], dtype=np.int64))
        noisy = logprobs / temperature + rng.gumbel(size=logprobs.shape)
        for row, i in enumerate(active):
            token = int(np.argmax(noisy[row]))
            totals[i] += float(logprobs[row, token])
            if token == eot:
                done[i] = True
            else:
                seqs[i].append(token)
    start = len(initial)
    return [Candidate(tuple(seqs[i][start:]), totals[i], done[i]) for i in range(best_of)]


def rank(candidates: Sequence[Candidate], length_penalty: float | None = None) -> Candidate:
    """``MaximumLikelihoodRanker``: the highest sum log-probability over length (None) or over the
    Google NMT penalty ((5 + length) / 6) ** alpha; the first of equals wins, as numpy's argmax."""
    if not candidates:
        raise ValueError("no candidate to rank")

    def score(c: Candidate) -> float:
        length = max(len(c.tokens), 1)
        penalty = length if length_penalty is None else ((5 + length) / 6) ** length_penalty
        return c.sum_logprob / penalty

    scores = [score(c) for c in candidates]
    return candidates[int(np.argmax(scores))]


def decode_with_fallback(attempt: Callable[[float], Decoded], temperatures: Sequence[float],
                         compression_ratio_threshold: float | None = 2.4, logprob_threshold: float | None = -1.0,
                         no_speech_threshold: float | None = 0.6, ungated: bool = False) -> list[Decoded]:
    """Decode at each temperature in turn until the result is neither repetitive nor improbable.

    openai-whisper's rule: fall back when the compression ratio exceeds ``compression_ratio_threshold`` or
    the mean log-probability is below ``logprob_threshold``, except when the window is silence
    (no-speech probability above ``no_speech_threshold`` and the mean log-probability below the threshold),
    which no temperature will turn into speech. ``ungated`` (no VAD chose the audio) takes the no-speech
    probability alone for silence, as :meth:`Transcriber.transcribe` does. Returns every attempt made; the
    last is the one kept (also when every temperature failed).
    """
    if not temperatures:
        raise ValueError("no temperature to decode at")
    tried: list[Decoded] = []
    for t in temperatures:
        result = attempt(t)
        tried.append(result)
        if not fails_checks(result, compression_ratio_threshold, logprob_threshold, no_speech_threshold, ungated):
            break
    return tried


def fails_checks(result: Decoded, compression_ratio_threshold: float | None = 2.4,
                 logprob_threshold: float | None = -1.0, no_speech_threshold: float | None = 0.6,
                 ungated: bool = False) -> bool:
    """openai-whisper's fallback test of one decoding: repetitive or improbable, and not silence."""
    fallback = False
    if compression_ratio_threshold is not None and result.compression_ratio > compression_ratio_threshold:
        fallback = True  # too repetitive
    low = logprob_threshold is not None and result.avg_logprob < logprob_threshold
    if low:
        fallback = True  # too improbable
    if no_speech_threshold is not None and result.no_speech_prob > no_speech_threshold and (low or ungated):
        fallback = False  # silence: dropped by the no-speech rule, whatever the temperature
    return fallback
