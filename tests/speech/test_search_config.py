"""speech.asr's search keys and edgert run's search flags: what applies is taken, what cannot apply is
refused in one line (file:line for the YAML, the flag's name on the command line), never ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgert.cli.main import build_parser
from edgert.cli.run import build_config
from edgert.config import AsrConfig, load_config
from edgert.errors import ConfigError

from ..helpers import assert_one_line_error, run_cli


def write(tmp_path: Path, asr: str) -> Path:
    path = tmp_path / "asr.yaml"
    path.write_text("task: asr\nspeech:\n  asr:\n    model: whisper\n" + asr)
    return path


@pytest.mark.parametrize("asr, line, message", [
    ("    beam_size: 3\n", 5, "speech.asr.beam_size: applies to decoding: beam only"),
    ("    decoding: greedy\n    patience: 2.0\n", 6, "speech.asr.patience: applies to decoding: beam only"),
    ("    decoding: beam\n    best_of: 3\n", 6, "speech.asr.best_of: applies to sampling only"),
    ("    decoding: greedy\n    length_penalty: 0.5\n", 6, "speech.asr.length_penalty: ranks beams or samples"),
    ("    patience: 2.0\n", 5, "speech.asr.patience: applies to decoding: beam only (decoding is auto, which "
                               "picks its own"),
    ("    compression_ratio_threshold: 2.0\n", 5, "compression_ratio_threshold: decides the temperature fallback"),
    ("    decoding: beam\n    temperatures: [0.2, 0.4]\n", 6, "beam search runs at temperature 0"),
    ("    temperatures: [0.0, 0.4, 0.2]\n", 5, "expected rising temperatures"),
    ("    decoding: beam\n    beam_size: 0\n", 6, "speech.asr.beam_size: expected >= 1"),
    ("    decoding: beams\n", 5, "speech.asr.decoding: expected one of auto, greedy, beam"),
])
def test_a_key_that_cannot_apply_is_refused_with_its_line(tmp_path: Path, asr: str, line: int, message: str) -> None:
    path = write(tmp_path, asr)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}: ") and message in text and "\n" not in text


def test_search_keys_that_apply_reach_the_transcriber(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "    decoding: beam\n    beam_size: 3\n    patience: 2.0\n"
                                      "    temperatures: [0.0, 0.5, 1.0]\n    best_of: 2\n    length_penalty: 0.6\n"))
    assert cfg.speech.asr.search() == {"decoding": "beam", "beam_size": 3, "patience": 2.0, "length_penalty": 0.6,
                                       "temperatures": (0.0, 0.5, 1.0), "best_of": 2,
                                       "compression_ratio_threshold": 2.4}
    assert AsrConfig().search()["decoding"] == "auto"  # the default: the device decides (beam 5 GPU, 3 CPU)
    assert AsrConfig().search()["temperatures"] == (0.0,)  # decoded once
    assert AsrConfig(decoding="greedy").search()["decoding"] == "greedy"


def flags(*argv: str) -> object:
    return build_config(build_parser().parse_args(["run", *argv]))


def test_cli_flags_override_the_config(tmp_path: Path) -> None:
    cfg = flags("--task", "asr", "--decoding", "beam", "--beam-size", "4", "--fallback", "--best-of", "3")
    asr = cfg.speech.asr  # type: ignore[attr-defined]
    assert (asr.decoding, asr.beam_size, asr.best_of) == ("beam", 4, 3)
    assert asr.temperatures == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    path = write(tmp_path, "    decoding: beam\n")
    assert flags("--config", str(path), "--beam-size", "2").speech.asr.beam_size == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize("argv, message", [
    (("--task", "asr", "--beam-size", "3"), "--beam-size: applies to decoding: beam only .decoding is auto"),
    (("--task", "asr", "--decoding", "auto", "--beam-size", "3"), "--beam-size: applies to decoding: beam only"),
    (("--task", "asr", "--decoding", "greedy", "--beam-size", "3"),
     "--beam-size: applies to decoding: beam only .decoding is greedy"),
    (("--task", "detect", "--decoding", "auto"), "--decoding: for task asr .or a speech.chain with asr. only"),
    (("--task", "asr", "--decoding", "beam", "--best-of", "3"), "--best-of: applies to sampling only"),
    (("--task", "detect", "--decoding", "beam"), "--decoding: for task asr .or a speech.chain with asr. only"),
    (("--task", "vad", "--fallback"), "--fallback: for task asr .or a speech.chain with asr. only, not task vad"),
])
def test_cli_flag_that_cannot_apply_is_refused(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("'", ".")):
        flags(*argv)


def test_cli_refusal_is_one_line_without_traceback(tmp_path: Path) -> None:
    result = run_cli("run", "--task", "asr", "--model", str(tmp_path), "--source", str(tmp_path / "x.wav"),
                     "--beam-size", "3")
    assert_one_line_error(result, "--beam-size", "decoding: beam only")


def test_decoding_auto_is_the_default_and_can_be_named(tmp_path: Path) -> None:
    from edgert.search_rules import AUTO_CPU, AUTO_GPU, auto_decoding

    assert load_config(write(tmp_path, "")).speech.asr.decoding == "auto"
    assert load_config(write(tmp_path, "    decoding: auto\n")).speech.asr.decoding == "auto"
    assert flags("--task", "asr", "--decoding", "auto").speech.asr.decoding == "auto"  # type: ignore[attr-defined]
    assert flags("--task", "asr", "--decoding", "greedy").speech.asr.decoding == "greedy"  # type: ignore[attr-defined]
    assert auto_decoding(True) == AUTO_GPU == ("beam", 5)  # the GPU table's choice (docs/speech.md)
    assert auto_decoding(False) == AUTO_CPU
