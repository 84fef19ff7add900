"""The run-flag table: a row is a flag in ``--help``, a config key, and a refusal for a task it cannot apply to.

Every flag that applies to one kind of task is refused on the other in one line naming it: vision-only flags
with a speech task, Whisper's search flags with detection; and the config keys behind the vision flags with a
speech task through the Python API. Nothing is warned about and ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgert.cli import run_flags
from edgert.cli.main import build_parser, main
from edgert.cli.run import build_config
from edgert.cli.run_flags import ASR, DETECTION, RUN_FLAGS, RunFlag, flags_markdown
from edgert.config import PipelineConfig, from_mapping
from edgert.errors import ConfigError

#: A value for each flag that takes one (the others are switches).
VALUES = {"--conf": "0.3", "--iou": "0.5", "--classes": "person", "--track": "sort", "--processing": "cpu",
          "--slots": "2",
          "--memory": "pinned", "--batch": "2", "--batch-timeout-ms": "5", "--decoding": "beam",
          "--beam-size": "3", "--best-of": "2", "--capture": "process", "--line": "door:0.5,0,0.5,1",
          "--zone": "hall:0,0,1,0,1,1", "--track-workers": "2"}


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("edgert: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _flag(flag: str) -> list[str]:
    return [flag, VALUES[flag]] if flag in VALUES else [flag]


VISION_ONLY_FLAGS = [row.flag for row in RUN_FLAGS if row.tasks == DETECTION]
SPEECH_ONLY_FLAGS = [row.flag for row in RUN_FLAGS if row.tasks == ASR]


def test_the_table_marks_the_task_specific_flags() -> None:
    assert {"--conf", "--track", "--slots", "--batch", "--processing", "--loop", "--preload",
            "--realtime"} <= set(VISION_ONLY_FLAGS)
    assert set(SPEECH_ONLY_FLAGS) == {"--decoding", "--beam-size", "--fallback", "--best-of"}
    assert len({row.flag for row in RUN_FLAGS}) == len(RUN_FLAGS)


@pytest.mark.parametrize("flag", sorted(VISION_ONLY_FLAGS))
def test_vision_only_flag_with_a_speech_task(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(["run", "--task", "wakeword", "--model", str(tmp_path / "w.onnx"), "--source",
                            str(tmp_path / "a.wav"), *_flag(flag)], capsys)
    assert flag in line and "detection only" in line and "wakeword" in line


@pytest.mark.parametrize("flag", sorted(SPEECH_ONLY_FLAGS))
def test_speech_only_flag_with_detection(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(["run", "--model", str(tmp_path / "m.onnx"), "--source", str(tmp_path / "v.mp4"),
                            *_flag(flag)], capsys)
    assert flag in line and "task asr" in line and "not task detect" in line


def test_several_are_named_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(["run", "--task", "asr", "--model", str(tmp_path), "--source", "a.wav", "--conf", "0.2",
                            "--track", "--slots", "3"], capsys)
    assert "--conf, --track, --slots" in line


@pytest.mark.parametrize(("data", "key"), [
    ({"track": {"tracker": "bytetrack"}}, "track"),
    ({"runtime": {"slots": 2}}, "runtime.slots"),
    ({"runtime": {"batch": 2}}, "runtime.batch"),
    ({"runtime": {"processing": "gpu"}}, "runtime.processing"),
    ({"runtime": {"part_batches": False}}, "runtime.part_batches"),
    ({"source": {"uri": "a.wav", "loop": True}}, "source.loop"),
    ({"source": {"uri": "a.wav", "realtime": True}}, "source.realtime"),
])
def test_vision_keys_with_a_speech_task_through_the_api(data: dict[str, object], key: str) -> None:
    from edgert.pipeline.speech import refuse_vision_keys

    config = from_mapping(PipelineConfig, {"task": "vad", **data})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as info:
        refuse_vision_keys(config)
    assert "\n" not in str(info.value)


def test_a_new_row_is_a_flag_a_config_key_and_a_refusal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    row = RunFlag("--max-det", "keep at most N boxes per frame (decode.max_det)", "decode.max_det", DETECTION,
                  type=int, metavar="N")
    monkeypatch.setattr(run_flags, "RUN_FLAGS", (*RUN_FLAGS, row))
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--max-det N" in capsys.readouterr().out
    args = build_parser().parse_args(["run", "--model", "m.onnx", "--source", "v.mp4", "--max-det", "7"])
    assert build_config(args).decode.max_det == 7
    line = _one_line_error(["run", "--task", "vad", "--model", str(tmp_path / "v.onnx"), "--source", "a.wav",
                            "--max-det", "7"], capsys)
    assert "--max-det" in line and "not task vad" in line
    assert "`--max-det N` | `decode.max_det` | detect |" in flags_markdown()


@pytest.mark.parametrize(("flag", "value"), [("--batch", "0"), ("--slots", "0"), ("--batch", "-1"),
                                             ("--conf", "2"), ("--threads", "-1"), ("--beam-size", "0")])
def test_a_bad_value_is_refused_naming_the_flag(flag: str, value: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    task = ["--task", "asr", "--decoding", "beam"] if flag == "--beam-size" else []
    line = _one_line_error(["run", *task, "--model", str(tmp_path / "m.onnx"), "--source", "v.mp4", flag, value],
                           capsys)
    assert line.startswith(f"edgert: error: {flag}: expected")


def test_the_readme_lists_every_flag_from_the_table() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert flags_markdown() in readme, "README.md's run-flag table is stale: python -m edgert.cli.run_flags"
