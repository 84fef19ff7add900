from __future__ import annotations

from pathlib import Path

import pytest

from edgert.config import DecodeConfig, PipelineConfig, PreprocessConfig, from_mapping, load_config
from edgert.errors import ConfigError
from tests.helpers import assert_one_line_error, run_cli

GOOD = """\
task: detect
model:
  path: model.onnx
  threads: 2
preprocess:
  size: [416, 416]
  mean: [0.1, 0.2, 0.3]
decode:
  conf: 0.4
  classes: [0, 2]
sinks: ["jsonl://-", out.mp4]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


def test_good_config_loads_with_types(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.model.threads == 2
    assert cfg.preprocess.size == (416, 416)
    assert cfg.preprocess.mean == (0.1, 0.2, 0.3)
    assert cfg.decode.classes == (0, 2)
    assert cfg.sinks == ("jsonl://-", "out.mp4")
    assert cfg.decode.iou == DecodeConfig().iou  # defaults fill the rest


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "model:\n  path: m.onnx\npreprocess:\n  mean: [1, 2]\n",
            "pipeline.yaml:4: preprocess.mean: expected 3 numbers, got 2",
        ),
        ("preprocess:\n  colour: rgb\n", "pipeline.yaml:2: preprocess.colour: unknown key"),
        ("decode:\n  conf: high\n", "pipeline.yaml:2: decode.conf: expected a number, got the string 'high'"),
        ("decode:\n  conf: 1.5\n", "pipeline.yaml:2: decode.conf: expected 0..1"),
        ("preprocess:\n  layout: CHW\n", "pipeline.yaml:2: preprocess.layout: expected one of auto, NCHW, NHWC"),
        ("runtime:\n  queue_size: 0\n", "pipeline.yaml:2: runtime.queue_size: expected >= 1"),
        ("model: [1, 2]\n", "pipeline.yaml:1: model: expected a mapping"),
        ("model:\n  path: a\n   bad: indent\n", "pipeline.yaml:3: invalid YAML"),
    ],
)
def test_bad_config_names_file_line_and_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert f"{tmp_path}/{expected}" in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == PipelineConfig()


def test_from_mapping_without_file() -> None:
    cfg = from_mapping(PreprocessConfig, {"pad_value": 0, "color": "bgr"})
    assert cfg.pad_value == 0 and cfg.color == "bgr"
    with pytest.raises(ConfigError, match=r"pad_value: expected 0\.\.255"):
        from_mapping(PreprocessConfig, {"pad_value": 300})


def test_bad_config_through_cli_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  path: m.onnx\n\npreprocess:\n  mean: [1, 2]\n")
    assert_one_line_error(run_cli("config", str(path)), "pipeline.yaml:5: preprocess.mean: expected 3 numbers, got 2")


def test_good_config_through_cli_round_trips(tmp_path: Path) -> None:
    result = run_cli("config", str(write(tmp_path, GOOD)))
    assert result.returncode == 0, result.stderr
    again = write(tmp_path, result.stdout)
    assert load_config(again) == load_config(write(tmp_path, GOOD))


def test_missing_config_file_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("config", str(tmp_path / "nope.yaml")), "config file not found")
