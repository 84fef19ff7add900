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
    assert cfg.sinks == ("jsonl://-", str(tmp_path.resolve() / "out.mp4"))  # paths follow the file
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
        ("model: [1, 2]\n", "pipeline.yaml:1: model: expected a string (path) or a mapping"),
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
    (tmp_path / "model.onnx").write_bytes(b"")  # edgert config checks that the files it names are there
    result = run_cli("config", str(write(tmp_path, GOOD)))
    assert result.returncode == 0, result.stderr
    again = write(tmp_path, result.stdout)
    assert load_config(again) == load_config(write(tmp_path, GOOD))


def test_missing_config_file_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("config", str(tmp_path / "nope.yaml")), "config file not found")


def test_model_and_source_as_strings(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "model: yolov8n.onnx\nsource: /dev/video0\n"))
    assert cfg.model.path == str(tmp_path.resolve() / "yolov8n.onnx") and cfg.model.backend == "auto"
    assert cfg.source.uri == "/dev/video0" and cfg.source.loop is False
    with pytest.raises(ConfigError, match=r"pipeline.yaml:1: source: expected a string \(uri\) or a mapping, got"):
        load_config(write(tmp_path, "source: [1]\n"))


def test_names_from_a_labels_file_beside_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("person\nfork lift\n  pallet  \n\n")  # trailing blank lines are fine
    cfg = load_config(write(tmp_path, "decode:\n  names: labels.txt\n"))
    assert cfg.decode.names == ("person", "fork lift", "pallet")
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    (elsewhere / "pipeline.yaml").write_text("decode: {names: ../labels.txt}\n")
    assert load_config(elsewhere / "pipeline.yaml").decode.names == ("person", "fork lift", "pallet")


def test_names_coco() -> None:
    from edgert.coco import COCO_NAMES

    cfg = from_mapping(DecodeConfig, {"names": "coco"})
    assert cfg.names == COCO_NAMES and len(COCO_NAMES) == 80 and cfg.names[2] == "car"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (None, r"pipeline.yaml:3: decode.names: labels file .*missing.txt not found"),
        ("", r"pipeline.yaml:3: decode.names: labels file .* is empty"),
        ("a\n\nb\n", r"pipeline.yaml:3: decode.names: .*missing.txt:2: empty line in the labels file"),
    ],
)
def test_bad_labels_file_names_file_line_and_key(tmp_path: Path, labels: str | None, expected: str) -> None:
    if labels is not None:
        (tmp_path / "missing.txt").write_text(labels)
    with pytest.raises(ConfigError, match=expected) as err:
        load_config(write(tmp_path, "decode:\n  conf: 0.3\n  names: missing.txt\n"))
    assert "\n" not in str(err.value)


def test_paths_in_a_file_follow_the_file_not_the_working_directory(tmp_path: Path) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    path = folder / "p.yaml"
    path.write_text(
        "model: {path: models/m.onnx, engine_cache: engines}\n"
        "source: clips/in.mp4\n"
        "sinks: [out/a.mp4, 'jsonl://out/a.jsonl', 'jsonl://-', /abs/b.jsonl, 'http://127.0.0.1:8080', "
        "'frames/?every=10', '~/x.mp4']\n"
        "sources: []\n"
    )
    base = folder.resolve()
    cfg = load_config(path)
    assert cfg.model.path == str(base / "models/m.onnx") and cfg.model.engine_cache == str(base / "engines")
    assert cfg.source.uri == str(base / "clips/in.mp4")
    assert cfg.sinks == (str(base / "out/a.mp4"), f"jsonl://{base}/out/a.jsonl", "jsonl://-", "/abs/b.jsonl",
                         "http://127.0.0.1:8080", f"{base}/frames/?every=10", "~/x.mp4")
    path.write_text("source: {uri: '0'}\nsources: []\n")  # a camera index is not a path
    assert load_config(path).source.uri == "0"
    path.write_text("sources: [{uri: a.mp4, sinks: [o.mp4]}, {uri: 'rtsp://cam/1'}]\n")
    first, second = load_config(path).sources
    assert first.uri == str(base / "a.mp4") and first.sinks == (str(base / "o.mp4"),)
    assert second.uri == "rtsp://cam/1"


def test_edgert_config_names_the_files_that_are_not_there(tmp_path: Path) -> None:
    from tests.helpers import assert_one_line_error, run_cli

    (tmp_path / "m.onnx").write_bytes(b"x")
    cfg = tmp_path / "p.yaml"
    cfg.write_text("model: nope.onnx\nsources: [m.onnx, clip.mp4, /dev/video0, '0', 'rtsp://h/x', 'imgs/*.jpg']\n")
    assert_one_line_error(run_cli("config", str(cfg)),
                          f"not found: model.path {tmp_path / 'nope.onnx'}, sources[1].uri {tmp_path / 'clip.mp4'}. "
                          "Note: paths in a config are relative to the config file")
    cfg.write_text("model: m.onnx\nsource: m.onnx\n")
    assert run_cli("config", str(cfg)).returncode == 0
