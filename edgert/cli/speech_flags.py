"""``edgert run`` flags of Whisper's token search: ``--decoding``, ``--beam-size``, ``--fallback``, ``--best-of``.

They override ``speech.asr`` of the config and are refused, in one line naming the flag, where they cannot
apply (a detection task, ``--beam-size`` with greedy decoding, ``--best-of`` without ``--fallback``). This
module reads only the config: building the parser must not import the speech stack (seconds on a board).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from edgert.config import FieldError, PipelineConfig
from edgert.errors import ConfigError
from edgert.search_rules import AUTO_CPU, AUTO_GPU, DECODINGS

__all__ = ["add_asr_arguments", "apply_asr_flags"]

#: openai-whisper's fallback schedule (edgert.speech.decoding.FALLBACK_TEMPERATURES; a test keeps them equal)
_FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
_ASR_FLAGS = {"decoding": "--decoding", "beam_size": "--beam-size", "temperatures": "--fallback",
              "best_of": "--best-of"}


def add_asr_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of Whisper's token search on ``edgert run`` (they override ``speech.asr``)."""
    g = p.add_argument_group("speech recognition (--task asr; speech.asr.decoding ...; docs/speech.md)")
    g.add_argument("--decoding", choices=list(DECODINGS),
                   help=f"Whisper's token search: auto (default: {AUTO_GPU[0]} {AUTO_GPU[1]} on a GPU, {AUTO_CPU[0]} "
                        f"{AUTO_CPU[1]} on the CPU), greedy, or openai-whisper's beam search")
    g.add_argument("--beam-size", type=int, metavar="N", help="beams with --decoding beam (default 5)")
    g.add_argument("--fallback", action="store_true", default=None,
                   help="openai-whisper's temperature fallback: a repetitive or improbable window is decoded "
                        "again at 0.2, 0.4 ... 1.0 by sampling")
    g.add_argument("--best-of", type=int, metavar="N", help="samples per fallback temperature (default 5)")


def apply_asr_flags(config: PipelineConfig, args: argparse.Namespace) -> PipelineConfig:
    """``config`` with the search flags of :func:`add_asr_arguments` applied; a flag that cannot apply is an error."""
    changes: dict[str, Any] = {
        "decoding": getattr(args, "decoding", None), "beam_size": getattr(args, "beam_size", None),
        "temperatures": _FALLBACK if getattr(args, "fallback", None) else None,
        "best_of": getattr(args, "best_of", None)}
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        return config
    if config.task != "asr" and "asr" not in config.speech.chain:
        flags = ", ".join(_ASR_FLAGS[k] for k in changes)
        raise ConfigError(f"{flags}: Whisper's token search applies to --task asr (or a speech.chain with asr), "
                          f"not task {config.task}")
    try:
        asr = dataclasses.replace(config.speech.asr, **changes)
    except FieldError as exc:
        raise ConfigError(f"{_ASR_FLAGS.get(exc.field_name, 'speech.asr.' + exc.field_name)}: {exc.message}") from None
    return dataclasses.replace(config, speech=dataclasses.replace(config.speech, asr=asr))
