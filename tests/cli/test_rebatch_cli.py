"""``edgert rebatch`` and ``edgert bench --batch`` through the real CLI, on tiny models built here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgert.rewrite.batch import has_dynamic_batch
from tests.helpers import assert_one_line_error, run_cli
from tests.rewrite.test_batch import folding, rewritable

ort = pytest.importorskip("onnxruntime")


@pytest.fixture()
def models(tmp_path: Path) -> dict[str, Path]:
    good, bad = tmp_path / "good.onnx", tmp_path / "fold.onnx"
    onnx.save(rewritable(), str(good))
    onnx.save(folding(), str(bad))
    return {"good": good, "bad": bad}


def test_rebatch_writes_a_checked_model(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out" / "good-dyn.onnx"
    r = run_cli("rebatch", str(models["good"]), "-o", str(out), "--check", "1,3", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [c["batch"] for c in res["check"]] == [1, 3]
    assert any("Reshape_flat" in c for c in res["changes"])
    assert has_dynamic_batch(out)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.zeros((6, 3, 4, 4), np.float32)})[0].shape == (6, 64)
    text = run_cli("rebatch", str(models["good"]), "-o", str(out), "--check", "none")
    assert text.returncode == 0 and "not checked" in text.stdout


def test_rebatch_refuses_in_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "never.onnx"
    r = run_cli("rebatch", str(models["bad"]), "-o", str(out))
    assert_one_line_error(r, "fold.onnx: node Reshape_fold (Reshape) folds the batch", "[1, 3, 16] -> [3, 16]")
    assert not out.exists()
    assert_one_line_error(run_cli("rebatch", str(models["good"]), "-o", str(out), "--check", "0,2"), "--check")


def test_bench_measures_each_batch_size(models: dict[str, Path], tmp_path: Path) -> None:
    env = {"EDGERT_CACHE_DIR": str(tmp_path / "cache")}
    r = run_cli("bench", str(models["good"]), "--backend", "onnxruntime", "--batch", "1,2,4", "--iterations", "5",
                "--warmup", "1", "--json", env=env)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["batched_model"] and Path(res["batched_model"]).parent == tmp_path / "cache" / "batch"
    assert [b["batch"] for b in res["batches"]] == [1, 2, 4]
    for b in res["batches"]:
        assert b["inputs"]["x"] == [b["batch"], 3, 4, 4]
        assert b["iterations"] == 5
        assert b["frames_per_s"] == pytest.approx(b["batch"] * b["calls_per_s"])
        assert b["latency_ms"]["p50"] > 0
    table = run_cli("bench", str(models["good"]), "--backend", "onnxruntime", "--batch", "2", "--iterations", "3",
                    env=env)
    assert table.returncode == 0, table.stderr
    assert "frames/s" in table.stdout and "batch made dynamic" in table.stdout
    assert_one_line_error(run_cli("bench", str(models["bad"]), "--backend", "onnxruntime", "--batch", "1,2",
                                  env=env), "Reshape_fold")
