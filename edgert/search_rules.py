"""The rules a Whisper search's settings must keep, in one place: the config (``speech.asr``), the
:class:`~edgert.speech.asr.WhisperASR` constructor and the search functions of :mod:`edgert.speech.decoding`
all ask here, and each says the problem in its own error type (ConfigError with the key, InputError,
ValueError).

Each function returns what is wrong, in words, or None.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["AUTO_CPU", "AUTO_GPU", "DECODINGS", "DEFAULT_BEAM_SIZE", "at_least_one", "auto_decoding",
           "decoding_problem", "length_penalty_problem", "patience_problem", "temperatures_problem"]

#: The beam size a search uses when none is given (openai-whisper's).
DEFAULT_BEAM_SIZE = 5

#: ``decoding``: ``auto`` (the device decides: :func:`auto_decoding`), ``greedy`` or ``beam``.
DECODINGS = ("auto", "greedy", "beam")

#: What ``decoding: auto`` runs, (decoding, beam size), from the measured tables of docs/speech.md. On a GPU
#: (H200, ONNX Runtime CUDA) beam 5 halves greedy's WER (2.82 % against 5.63 % on the shared clips) at an RTF of
#: 0.045: far under 1. On the CPU beam 3 keeps the held-out WER under 10 % (greedy's is 13 %: it merges two
#: words into a made-up one) at a CPU cost near greedy's, now that the beams share one decoder call a step.
AUTO_GPU: tuple[str, int] = ("beam", 5)
AUTO_CPU: tuple[str, int] = ("beam", 3)


def decoding_problem(decoding: str) -> str | None:
    """One of :data:`DECODINGS`."""
    return None if decoding in DECODINGS else f"expected auto, greedy or beam, got {decoding!r}"


def auto_decoding(gpu: bool) -> tuple[str, int]:
    """(decoding, beam size) that ``decoding: auto`` runs on a GPU (``gpu``) or on the CPU."""
    return AUTO_GPU if gpu else AUTO_CPU


def temperatures_problem(temperatures: Sequence[float], beam: bool) -> str | None:
    """Rising temperatures >= 0; a beam search starts at 0 (it runs at temperature 0)."""
    t = [float(x) for x in temperatures]
    if not t or any(x < 0 for x in t) or any(a >= b for a, b in zip(t, t[1:])):
        return f"expected rising temperatures >= 0, such as [0.0, 0.2, 0.4], got {t}"
    if beam and t[0] != 0.0:
        return f"beam search runs at temperature 0: start with 0.0, got {t}"
    return None


def at_least_one(value: int) -> str | None:
    """A count (beam_size, best_of) of one or more."""
    return None if value >= 1 else f"expected >= 1, got {value}"


def patience_problem(patience: float | None, beam_size: int | None) -> str | None:
    """A patience above 0 that keeps at least one finished candidate (``round(beam_size * patience) >= 1``)."""
    if patience is None:
        return None
    size = DEFAULT_BEAM_SIZE if beam_size is None else beam_size
    if patience > 0 and round(size * patience) >= 1:
        return None
    return f"expected > 0 keeping at least one candidate with beam_size {size}, got {patience}"


def length_penalty_problem(alpha: float | None) -> str | None:
    """None (rank by sum logprob / length) or an alpha in 0..1."""
    return None if alpha is None or 0.0 <= alpha <= 1.0 else f"expected 0..1, got {alpha}"
