"""scripts/bench_batch_gpu.py with ``--provider cpu`` (its local mode) on a tiny model: table, JSON, check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.helpers import ROOT
from tests.rewrite.test_batch import folding, rewritable

pytest.importorskip("onnxruntime")


def test_script_measures_batches_and_checks_rows(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.onnx", tmp_path / "fold.onnx"
    onnx.save(rewritable(), str(good))
    onnx.save(folding(), str(bad))
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_batch_gpu.py"), "--provider", "cpu",
                        "--models", str(good), str(bad), "--batches", "1,2,4", "--iterations", "3", "--rounds", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"EDGERT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    g = rep["models"]["good.onnx"]
    assert [x["batch"] for x in g["plain"]] == [1, 2, 4]
    for x in g["plain"]:
        assert x["frames_per_s"] == pytest.approx(x["batch"] * x["calls_per_s"], rel=0.02)
        assert len(x["frames_per_s_rounds"]) == 2 and x["latency_ms_p50"] > 0
    assert g["check"]["batch"] == 4 and g["check"]["rows_match_1e-4"] is True
    assert "Reshape_fold" in rep["models"]["fold.onnx"]["error"]
    assert "| good.onnx | plain | 4 |" in r.stdout
