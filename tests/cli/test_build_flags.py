"""``edgert build`` flags that cannot apply are refused in one line, before any TensorRT is needed."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import assert_one_line_error, run_cli, tiny_model


def test_contexts_without_a_profile_is_refused(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "m.onnx")
    assert_one_line_error(run_cli("build", str(model), "--contexts", "2"), "--contexts", "--batch N")


def test_batch_with_shapes_or_output_is_refused(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "m.onnx")
    assert_one_line_error(run_cli("build", str(model), "--batch", "4", "--shapes", "x:1x3x8x8"), "--batch and --shapes")
    assert_one_line_error(run_cli("build", str(model), "--batch", "4", "-o", str(tmp_path / "e.engine")),
                          "--batch and -o")
    assert_one_line_error(run_cli("build", str(model), "--batch", "0"), "--batch: expected 1..64")
