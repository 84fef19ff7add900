"""Word error rate with the usual normalisation (lower case, punctuation stripped)."""

from __future__ import annotations

import re

__all__ = ["normalize_text", "wer", "word_errors"]

_PUNCT = re.compile(r"[^\w\s']|_")


def normalize_text(text: str) -> list[str]:
    """Lower case, hyphens become spaces, other punctuation goes; apostrophes inside words stay."""
    text = text.lower().replace("-", " ")
    text = _PUNCT.sub(" ", text)
    return [w.strip("'") for w in text.split() if w.strip("'")]


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance over words: substitutions + deletions + insertions."""
    prev = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, 1):
        cur = [i] + [0] * len(hypothesis)
        for j, hyp_word in enumerate(hypothesis, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ref_word != hyp_word))
        prev = cur
    return prev[-1]


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER: total word errors over total reference words."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    errors = sum(word_errors(normalize_text(r), normalize_text(h)) for r, h in zip(references, hypotheses))
    words = sum(len(normalize_text(r)) for r in references)
    return errors / max(words, 1)
