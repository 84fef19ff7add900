"""Word error rate, with Whisper's English normalizer (as published Whisper WERs are) or a basic one.

``normalizer="whisper"`` is OpenAI Whisper's ``EnglishTextNormalizer`` (whisper/normalizers/english.py:
numbers spoken or written become digits, "Mr." becomes "mister", British spellings American, fillers
and bracketed text go) through the ``whisper-normalizer`` package, which ships that module unchanged
(``pip install whisper-normalizer``, Python 3.9+; in the test extra, not a Jetson extra: it brings
``regex`` and ``text2num``). "10 of clubs" and "ten of clubs" then match. ``"basic"`` is edgert's first
rule (lower case, punctuation stripped), kept for comparison and where the package cannot install.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from edgert._lazy import lazy_import

__all__ = ["NORMALIZERS", "normalize_text", "wer", "word_errors"]

_PUNCT = re.compile(r"[^\w\s']|_")
NORMALIZERS = ("basic", "whisper")
_whisper: Callable[[str], str] | None = None


def _basic(text: str) -> list[str]:
    text = text.lower().replace("-", " ")
    text = _PUNCT.sub(" ", text)
    return [w.strip("'") for w in text.split() if w.strip("'")]


def _whisper_english() -> Callable[[str], str]:
    global _whisper
    if _whisper is None:
        module: Any = lazy_import("whisper_normalizer.english", "Whisper's English text normalizer")
        _whisper = module.EnglishTextNormalizer()
    return _whisper


def normalize_text(text: str, normalizer: str = "basic") -> list[str]:
    """The words of ``text`` after ``normalizer``: "basic" (lower case, hyphens become spaces, other
    punctuation goes, apostrophes inside words stay) or "whisper" (Whisper's EnglishTextNormalizer)."""
    if normalizer == "whisper":
        return _whisper_english()(text).split()
    if normalizer != "basic":
        raise ValueError(f"unknown normalizer {normalizer!r}: expected one of {', '.join(NORMALIZERS)}")
    return _basic(text)


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance over words: substitutions + deletions + insertions."""
    prev = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, 1):
        cur = [i] + [0] * len(hypothesis)
        for j, hyp_word in enumerate(hypothesis, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ref_word != hyp_word))
        prev = cur
    return prev[-1]


def wer(references: list[str], hypotheses: list[str], normalizer: str = "basic") -> float:
    """Corpus WER: total word errors over total reference words, both normalised by ``normalizer``."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    errors = sum(word_errors(normalize_text(r, normalizer), normalize_text(h, normalizer))
                 for r, h in zip(references, hypotheses))
    words = sum(len(normalize_text(r, normalizer)) for r in references)
    return errors / max(words, 1)
