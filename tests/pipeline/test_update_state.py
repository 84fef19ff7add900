"""The update state file: restarts come back on the last swapped-in model, a crash loop on the one before,
``edgert update`` drops a model safely and rolls back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgert.config import ModelConfig, PipelineConfig
from edgert.pipeline.update_state import CRASH_STARTS, read_state, record_swap, start_config
from tests.helpers import run_cli


def _models(tmp_path: Path) -> tuple[Path, Path, PipelineConfig]:
    old, new = tmp_path / "old.onnx", tmp_path / "new.onnx"
    old.write_bytes(b"old")
    new.write_bytes(b"new")
    config = PipelineConfig(model=ModelConfig(path=str(old), update_dir=str(tmp_path / "updates")))
    return old, new, config


def test_a_crash_loop_comes_back_on_the_last_good_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old, new, config = _models(tmp_path)
    assert start_config(config) is config  # no update yet: the configured model
    record_swap(tmp_path / "updates", str(new), "new.onnx", str(old), "old.onnx")  # the run that swapped it in
    # the unit restarts after each crash, reading the state file as it starts
    for _ in range(CRASH_STARTS - 1):
        assert start_config(config).model.path == str(new)
    assert read_state(tmp_path / "updates")["probation"]["starts"] == CRASH_STARTS
    back = start_config(config)
    assert back.model.path == str(old)
    assert "rolled back to old.onnx: crash loop" in caplog.text
    state = read_state(tmp_path / "updates")
    assert state["current"]["label"] == "old.onnx" and "probation" not in state
    assert state["rolled_back"]["label"] == "new.onnx"
    assert start_config(config).model.path == str(old)  # and stays there


def test_a_model_that_lived_through_probation_stays_across_restarts(tmp_path: Path) -> None:
    from edgert.pipeline.update_state import settle

    old, new, config = _models(tmp_path)
    record_swap(tmp_path / "updates", str(new), "new.onnx", str(old), "old.onnx")
    settle(tmp_path / "updates")
    for _ in range(CRASH_STARTS + 1):
        assert start_config(config).model.path == str(new)


def test_edgert_update_drops_then_rolls_back(tmp_path: Path) -> None:
    old, new, config = _models(tmp_path)
    folder = tmp_path / "updates"
    r = run_cli("update", "--dir", str(folder), str(new), "--precision", "int8")
    assert r.returncode == 0, r.stderr
    assert (folder / "new.onnx").read_bytes() == b"new"
    assert json.loads((folder / "new.onnx.json").read_text()) == {"precision": "int8"}
    assert not list(folder.glob(".*"))  # the hidden copy was renamed into place
    r = run_cli("update", "--dir", str(folder), "--rollback")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0
    assert "no previous model to roll back to" in r.stderr
    record_swap(folder, str(new), "new.onnx", str(old), "old.onnx")
    r = run_cli("update", "--dir", str(folder), "--rollback")
    assert r.returncode == 0, r.stderr
    assert "rolled back to old.onnx" in r.stdout
    assert json.loads((folder / "rollback").read_text())["path"] == str(old)  # a running pipeline swaps back
    assert start_config(config).model.path == str(old)


def test_edgert_update_finds_a_services_folder(tmp_path: Path) -> None:
    old, new, _ = _models(tmp_path)
    cfg = tmp_path / "cam.yaml"
    cfg.write_text(f"model:\n  path: {old}\n  update_dir: {tmp_path / 'updates'}\n")
    units = tmp_path / "units"
    units.mkdir()
    (units / "edgert-cam.service").write_text(f"[Service]\nExecStart=/usr/bin/edgert run --config {cfg}\n")
    r = run_cli("update", "--service", "cam", "--unit-dir", str(units), str(new))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "updates/new.onnx").exists()
    r = run_cli("update", "--service", "nope", "--unit-dir", str(units), str(new))
    assert r.returncode == 1 and "edgert-nope.service" in r.stderr


def test_a_candidate_that_does_not_fit_beside_the_running_model_is_refused(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from edgert.pipeline.update_door import available_memory, memory_refusal

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:  7630000 kB\nMemAvailable:  1048576 kB\n")
    monkeypatch.setenv("EDGERT_SYSROOT", str(tmp_path))
    assert available_memory() == 2**30
    assert memory_refusal(15 * 2**20, 3, 2**30) is None  # nanodet, two slots and the gate: about 135 MiB
    why = memory_refusal(200 * 2**20, 3, 2**30)
    assert why == "it needs about 1800 MiB beside the running model (3 sessions of a 200 MiB model) and 1024 MiB " \
                  "are available"
    assert memory_refusal(200 * 2**20, 3, None) is None  # nothing to measure: no refusal


@pytest.mark.slow
def test_a_unit_crash_looping_on_a_new_model_restarts_on_the_last_good_one(tmp_path: Path) -> None:
    """Real ``edgert run`` processes, as a unit's restarts start them: the state says a new model is on
    probation; two starts on it are killed (SIGKILL: a crash, no clean stop), the third start is too, and the
    next one runs the previous model and says why in one journal line."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    from tests.helpers import ROOT
    from tests.pipeline.media import make_video, tiny_detector

    good, bad = tiny_detector(tmp_path / "good.onnx"), tiny_detector(tmp_path / "bad.onnx", scores=(0.1, 0.9))
    video = make_video(tmp_path / "clip.avi")
    updates = tmp_path / "updates"
    cfg = tmp_path / "cam.yaml"
    cfg.write_text(f"model:\n  path: {good}\n  backend: onnxruntime\n  update_dir: {updates}\n"
                   f"source:\n  uri: {video}\n  loop: true\n")
    record_swap(updates, str(bad), "bad.onnx", str(good), "good.onnx")  # the run that swapped it in, then died
    argv = [sys.executable, "-m", "edgert.cli.main", "run", "--config", str(cfg)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for starts in range(2, CRASH_STARTS + 1):  # the unit restarts it; each start counts, each one crashes
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while read_state(updates).get("probation", {}).get("starts") != starts and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # running on the bad model
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert read_state(updates)["current"]["label"] == "bad.onnx"
    done = subprocess.run([*argv, "--max-frames", "5", "--json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == str(good)
    said = [line for line in done.stderr.splitlines() if "crash loop" in line]
    assert len(said) == 1 and said[0].endswith(
        f"model update: rolled back to good.onnx: crash loop ({CRASH_STARTS} starts on bad.onnx within its probation)")
    assert read_state(updates)["current"]["label"] == "good.onnx"
