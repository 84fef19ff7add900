"""Small real things tests build: tiny ONNX models, and running the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]


def tiny_model(path: Path, shape: Sequence[int | str] = (1, 3, 8, 8), op: str = "Relu") -> Path:
    """A one-node model, input ``x`` -> output ``y`` of the same shape (dims may be named: dynamic)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "tiny", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def scale_model(path: Path, shape: Sequence[int] = (1, 4), factor: float = 2.0) -> Path:
    """``y = x * factor``: a model whose output proves the input buffer was read."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [factor])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "scale", [x], [y], [k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m edgert.cli.main ARGS`` as a user would, and capture its output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "edgert.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """The CLI failed the way edgert promises: exit 1, one line on stderr, no traceback."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("edgert: error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


__all__ = ["ROOT", "assert_one_line_error", "np", "run_cli", "scale_model", "tiny_model"]
