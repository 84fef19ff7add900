"""No source takes the others down: an absent device node or an empty folder among several sources, a capture
worker killed under a camera.

Before, ``/dev/video9`` absent (or an empty folder) among several sources ended the whole run (rc 1) while a
missing file dropped out; now each drops out the same way (an absent device node is retried in the background
like a network camera that is down). A killed capture worker (``capture: process``) lost its camera for good
while the run went on with ``reconnecting 0``; now it is started again with the reconnect backoff, counted in
``reconnects`` and ``/metrics``, and the camera's frames flow again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.faults.conftest import Cli, free_port, sources_at_stop
from tests.faults.test_late_source import _lines, _metric, _wait_for_lines, _wait_metric


def _sources_config(tmp_path: Path, media: dict[str, Path], other: str) -> Path:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   "sources:\n"
                   f"  - {{uri: '{media['video']}', name: door}}\n"
                   f"  - {{uri: '{other}', name: other, timeout_s: 0.5}}\n"
                   f"sinks: ['jsonl://{tmp_path}/{{source}}.jsonl']\n", encoding="utf-8")
    return cfg


def test_an_empty_folder_among_several_sources_drops_out(tmp_path: Path, media: dict[str, Path]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    run = Cli("run", "--config", str(_sources_config(tmp_path, media, str(empty))), "--json")
    try:
        code, out = run.finish(120)
    finally:
        run.kill()
    assert code == 0, run.stderr
    per = {s["name"]: s for s in json.loads(out)["sources"]}
    assert per["door"]["frames"] == 40 and len(_lines(tmp_path / "door.jsonl")) == 40
    assert per["other"]["ended"] == "error" and "folder has no images" in per["other"]["error"]
    assert "source other did not open" in run.stderr


def test_an_absent_camera_among_several_sources_is_retried_in_the_background(
        tmp_path: Path, media: dict[str, Path]) -> None:
    device = "/dev/video97"
    if os.path.exists(device):
        pytest.skip(f"{device} exists on this machine")
    metrics = f"127.0.0.1:{free_port()}"
    run = Cli("run", "--config", str(_sources_config(tmp_path, media, device)), "--json", "--metrics", metrics)
    try:
        run.wait_for("reconnecting it in the background")
        _wait_metric(metrics, 'edgert_source_reconnecting{source="other"}', 1.0, run)
        _wait_for_lines(run, tmp_path / "door.jsonl", 40)
        assert len(_lines(tmp_path / "door.jsonl")) == 40
        other = sources_at_stop(run)["other"]
    finally:
        run.kill()
    assert other["reconnecting"] and device in other["start_error"]


def test_a_killed_capture_worker_is_started_again(tmp_path: Path, media: dict[str, Path],
                                                  late_server: tuple[int, threading.Event]) -> None:
    port, go = late_server
    go.set()
    cam = f"http://127.0.0.1:{port}/{media['long'].name}"
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   "sources:\n"
                   f"  - {{uri: '{cam}', name: cam, timeout_s: 5, capture: process}}\n"
                   f"  - {{uri: '{media['long']}', name: door, loop: true, capture: process}}\n"
                   f"sinks: ['jsonl://{tmp_path}/{{source}}.jsonl']\n", encoding="utf-8")
    metrics = f"127.0.0.1:{free_port()}"
    run = Cli("-v", "run", "--config", str(cfg), "--json", "--metrics", metrics)
    try:
        run.wait_for(f"for {cam}:")
        found = re.search(rf"capture worker (\d+) for {re.escape(cam)}:", run.stderr)
        assert found is not None, run.stderr
        pid = int(found.group(1))
        _wait_for_lines(run, tmp_path / "cam.jsonl", 5)
        os.kill(pid, signal.SIGKILL)
        run.wait_for("starting another in 0.5 s (restart 1)")
        run.wait_for(f"{cam}: capture worker restarted")
        before = len(_lines(tmp_path / "cam.jsonl"))
        _wait_for_lines(run, tmp_path / "cam.jsonl", before + 10)
        assert len(_lines(tmp_path / "cam.jsonl")) >= before + 10  # its frames flow again
        deadline = time.monotonic() + 30
        while (_metric(metrics, 'edgert_source_reconnects_total{source="cam"}') or 0) < 1:
            assert time.monotonic() < deadline, run.stderr
            time.sleep(0.1)
        cam_summary = sources_at_stop(run)["cam"]
    finally:
        run.kill()
    assert cam_summary["reconnects"] >= 1 and "error" not in cam_summary, cam_summary
    assert run.stderr.count("starting another in") == 1  # one death, one restart
