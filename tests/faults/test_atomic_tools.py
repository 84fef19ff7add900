"""Issue 25, case 6: a tool stopped while it writes leaves the old output, never half a new one.

The write is cut the way a full disk or a kill cuts it, deterministically: the CLI runs under a file-size
limit (RLIMIT_FSIZE) smaller than the model it writes, so its write fails part way.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.helpers import ROOT, tiny_model
from tests.rewrite.test_batch import rewritable

OLD = b"the previous output, which must survive"


def _cli_with_file_limit(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-B", "-m", "edgert.cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, preexec_fn=cap)


def _leftovers(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_rebatch_cut_mid_write_leaves_the_old_model(tmp_path: Path) -> None:
    src, out = tmp_path / "good.onnx", tmp_path / "good-dyn.onnx"
    onnx.save(rewritable(), str(src))
    out.write_bytes(OLD)
    proc = _cli_with_file_limit(src.stat().st_size // 2, "rebatch", str(src), "-o", str(out), "--check", "none")
    assert proc.returncode != 0
    assert out.read_bytes() == OLD
    assert _leftovers(tmp_path, {src.name, out.name}) == []


def test_convert_cut_mid_write_leaves_the_old_model(tmp_path: Path) -> None:
    pytest.importorskip("onnxconverter_common")
    src, out = tiny_model(tmp_path / "m.onnx", shape=(1, 3, 64, 64), op="Relu"), tmp_path / "m16.onnx"
    model = onnx.load(str(src))
    model.graph.initializer.append(numpy_helper.from_array(np.ones((1, 3, 64, 64), np.float32), "w"))  # bytes
    model.graph.node.append(helper.make_node("Add", ["y", "w"], ["z"]))
    model.graph.output[0].name = "z"
    onnx.save(model, str(src))
    out.write_bytes(OLD)
    proc = _cli_with_file_limit(src.stat().st_size // 4, "convert", str(src), "-o", str(out))
    assert proc.returncode != 0
    assert out.read_bytes() == OLD
    assert _leftovers(tmp_path, {src.name, out.name}) == []
