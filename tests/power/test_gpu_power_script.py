"""scripts/gpu_power.py, the device script, run here as far as this machine allows (no GPU).

``--simulate`` runs every phase against the simulated board; the second test runs the real (non-simulated)
path with the CPU backend and the INA meter of a fake Orin Nano root, including the ``edgert bench
--power`` subprocess. What only the GPU machine can run (NVML, the CUDA session, the torch stand-in) is
exercised there, by the lead, once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, tiny_model
from tests.power import boards

SCRIPT = ROOT / "scripts" / "gpu_power.py"


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=240,
                          cwd=ROOT, env={**os.environ, **(env or {})})


def test_simulated_run_writes_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "gpu_power.json"
    r = _run(["--simulate", "--out", str(out), "--idle-s", "1", "--max-s", "2", "--budget-s", "8",
              "--settle-s", "4", "--levels", "0.5"])
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["meter"]["meter"] == "simulated"
    assert report["idle"]["avg_w"] < report["unconstrained"]["avg_w"]
    assert report["unconstrained"]["mj_per_frame"] > 0
    (run,) = report["budget_runs"]
    assert run["settled_under_budget"] is True
    assert run["after_settling"]["fps"] > 0
    assert "finished" in report and "error" not in report


def test_real_path_with_a_sysfs_meter_and_the_cpu_backend(tmp_path: Path) -> None:
    root = boards.orin_nano_jp6(tmp_path / "root")
    model = tiny_model(tmp_path / "tiny.onnx", shape=(1, 3, 32, 32))
    out = tmp_path / "gpu_power.json"
    r = _run(["--out", str(out), "--meter", "ina", "--backend", "onnxruntime", "--model", str(model),
              "--idle-s", "0.5", "--max-s", "1", "--bench-s", "1", "--budget-s", "2", "--settle-s", "1",
              "--levels", "0.5"], env={"EDGERT_SYSROOT": str(root)})
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["meter"]["meter"] == "ina" and report["meter"]["rails"][0] == "VDD_IN"
    assert report["unconstrained"]["avg_w"] == pytest.approx(4.968)
    bench = report["bench_cli"]
    assert bench["exit"] == 0, bench
    assert bench["result"]["power"]["avg_w"] == pytest.approx(4.968) and bench["result"]["power"]["mj_per_frame"] > 0
    assert len(report["budget_runs"]) == 1 and "controller" in report["budget_runs"][0]


def test_no_meter_is_recorded_not_a_traceback(tmp_path: Path) -> None:
    out = tmp_path / "gpu_power.json"
    r = _run(["--out", str(out), "--meter", "auto"], env={"EDGERT_SYSROOT": str(tmp_path)})
    assert r.returncode == 1
    assert "no power meter" in json.loads(out.read_text())["error"]
