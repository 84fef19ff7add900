"""Bounded config: alias bombs, huge files, duplicate keys and out-of-range counts are one-line errors."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from edgert.config import (
    MAX_CONFIG_BYTES,
    MAX_QUEUE_SIZE,
    PipelineConfig,
    load_config,
)
from edgert.errors import ConfigError
from tests.helpers import assert_one_line_error, run_cli
from tests.pipeline.media import make_video, tiny_detector


def _alias_bomb(levels: int = 9) -> str:
    """The classic 'billion laughs' in YAML: each level is nine aliases of the one before."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for i in range(1, levels):
        prev, cur = names[i - 1], names[i]
        lines.append(f"{cur}: &{cur} [" + ",".join(f"*{prev}" for _ in range(9)) + "]")
    lines.append(f"sinks: *{names[levels - 1]}")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_fast_and_small(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    assert path.stat().st_size < 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"bomb.yaml:\d+: more than 100000 values once aliases are expanded"):
        load_config(path)
    assert time.monotonic() - t0 < 5.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: < 200 MB more


def test_alias_bomb_through_the_cli_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    r = run_cli("config", str(path), timeout=60)
    assert_one_line_error(r, "bomb.yaml", "aliases are expanded")


def test_modest_aliases_still_work(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text("defaults: &d [\"jsonl://-\"]\nsinks: *d\nmodel: {path: m.onnx}\n")
    with pytest.raises(ConfigError, match="defaults: unknown key"):  # the anchor's holder is still checked
        load_config(path)
    path.write_text("sinks: &s [\"jsonl://a.jsonl\", \"out.mp4\"]\nmodel: &m {path: m.onnx, threads: 2}\n")
    base = tmp_path.resolve()
    assert load_config(path).sinks == (f"jsonl://{base}/a.jsonl", str(base / "out.mp4"))


def test_recursive_alias_is_refused_not_hung(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("sinks: &x [*x]\n")
    with pytest.raises(ConfigError, match=r"loop\.yaml"):
        load_config(path)


def test_huge_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    row = "# " + "x" * 1000 + "\n"
    path.write_text(row * (MAX_CONFIG_BYTES // len(row) + 2))
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"big.yaml: config file is larger than 4 MiB"):
        load_config(path)
    assert time.monotonic() - t0 < 2.0


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("model:\n  path: a.onnx\n  threads: 2\ndecode:\n  conf: 0.3\nmodel:\n  path: b.onnx\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:6: model: given twice (also at line 1)")
    path.write_text("decode:\n  conf: 0.3\n  iou: 0.5\n  conf: 0.9\n")
    with pytest.raises(ConfigError, match=r"dup.yaml:4: decode.conf: given twice \(also at line 2\)"):
        load_config(path)
    r = run_cli("config", str(path), timeout=60)
    assert_one_line_error(r, "dup.yaml:4", "given twice", "line 2")


def test_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {conf: 0.3, iou: 0.5}\n")
    text = "decode:\n  <<: {conf: 0.3, iou: 0.5}\n  conf: 0.7\n"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.decode.conf == 0.7 and cfg.decode.iou == 0.5


@pytest.mark.parametrize(("text", "expected"), [
    ("runtime:\n  queue_size: 5000\n", f"c.yaml:2: runtime.queue_size: expected <= {MAX_QUEUE_SIZE}"),
    ("runtime:\n  queue_size: 0\n", "c.yaml:2: runtime.queue_size: expected >= 1, got 0"),
    ("runtime:\n  max_frames: -5\n", "c.yaml:2: runtime.max_frames: expected a number >= 0, got -5"),
    ("preprocess:\n  size: [100000, 100000]\n", "c.yaml:2: preprocess.size: expected sizes 1..8192"),
])
def test_counts_are_bounded_in_yaml(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{tmp_path}/{expected}" in str(info.value), str(info.value)


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("limits")
    return {"video": make_video(root / "v.avi", frames=5, size=(64, 48)), "model": tiny_detector(root / "t.onnx"),
            "root": root}


def test_yaml_and_flags_refuse_the_same_counts(media: dict[str, Path]) -> None:
    base = ("run", "--model", str(media["model"]), "--source", str(media["video"]))
    assert_one_line_error(run_cli(*base, "--queue-size", "5000", timeout=90), "--queue-size", "5000")
    assert_one_line_error(run_cli(*base, "--max-frames", "-5", timeout=90), "--max-frames", "-5")
    yaml_path = media["root"] / "neg.yaml"
    yaml_path.write_text("runtime:\n  max_frames: -5\n")
    assert_one_line_error(run_cli(*base, "--config", str(yaml_path), timeout=90),
                          "neg.yaml:2: runtime.max_frames", "-5")


def test_default_config_is_valid() -> None:
    assert PipelineConfig().runtime.queue_size <= MAX_QUEUE_SIZE


def _dynamic_detector(path: Path) -> Path:
    """tiny_detector's layout with a dynamic image size (the output grows with it)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    channels = 6
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, channels, "n"])
    w = helper.make_tensor("w", TensorProto.FLOAT, [channels, 3, 8, 8], np.zeros(channels * 3 * 64, np.float32))
    b = helper.make_tensor("b", TensorProto.FLOAT, [channels], np.array([16, 16, 8, 8, 0.9, 0.1], np.float32))
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], np.array([1, channels, -1], np.int64))
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["c"], kernel_shape=[8, 8], strides=[8, 8]),
             helper.make_node("Reshape", ["c", "shape"], ["output0"])]
    graph = helper.make_graph(nodes, "dyn", [x], [y], [w, b, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_huge_input_size_is_one_line(media: dict[str, Path]) -> None:
    """preprocess.size past the bound is refused; inside it, running out of memory is one line too."""
    model = _dynamic_detector(media["root"] / "dyn.onnx")
    base = ("run", "--model", str(model), "--source", str(media["video"]), "--max-frames", "2")
    config = media["root"] / "size.yaml"
    config.write_text("preprocess:\n  size: [100000, 100000]\n")
    assert_one_line_error(run_cli(*base, "--config", str(config), timeout=90), "size.yaml:2: preprocess.size")
    # Within the bound but beyond the memory this process may have (RLIMIT_AS through prlimit).
    import shutil
    import subprocess
    import sys

    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    limit = str(1536 * 1024 * 1024)
    cmd = ["prlimit", f"--as={limit}", sys.executable, "-m", "edgert.cli.main", *base]
    config.write_text("preprocess:\n  size: [64, 64]\n")
    control = subprocess.run([*cmd, "--config", str(config)], capture_output=True, text=True, timeout=90)
    if control.returncode != 0:
        pytest.skip(f"this machine cannot run the tiny model under a 1.5 GB address-space limit: {control.stderr}")
    config.write_text("preprocess:\n  size: [8192, 8192]\n")
    r = subprocess.run([*cmd, "--config", str(config)], capture_output=True, text=True, timeout=90)
    assert_one_line_error(r, "memory")
