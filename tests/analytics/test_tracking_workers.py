"""Tracking in worker processes (``track.workers``, ``--track-workers``), through the real CLI on real video.

- four different clips of vtest.avi with a line and a zone: the same JSONL per source (boxes, track ids, events)
  and the same tracks and counts in the summary with two workers as on the results thread;
- a worker killed mid-run is the run's error in one line, and the run ends (no hang), leaving no worker;
- SIGTERM stops the run cleanly and leaves no worker behind;
- what cannot apply is refused in one line; the default's rule.
Skips without the assets.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import assert_one_line_error, run_cli
from tests.pipeline.media import cut_clip

pytest.importorskip("onnxruntime")
cv2 = pytest.importorskip("cv2")

MODEL = "models/detection/nanodet-m-416-coco-v8layout.onnx"
RULES = ["--line", "door:0.5,0,0.5,1", "--zone", "lower:0,0.5,1,0.5,1,1,0,1:crowded_at=3"]


@pytest.fixture(scope="module")
def clips(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("clips")
    video = assets / "video/vtest.avi"
    return [cut_clip(video, root / f"c{i}.avi", start, 90) for i, start in enumerate((0, 150, 300, 450))]


def _sources(paths: list[Path]) -> list[str]:
    return [a for p in paths for a in ("--source", str(p))]


def _by_source(path: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        record.pop("timestamp", None)  # wall clock
        out.setdefault(str(record.get("source")), []).append(record)
    return out


def _worker_pids(pid: int) -> set[int]:
    """The run's multiprocessing children (capture is a thread in these runs: these are the tracking workers)."""
    try:
        children = {int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()
    return {c for c in children if b"spawn_main" in _cmdline(c)}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _gone(pids: set[int]) -> bool:
    for _ in range(50):
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_two_workers_give_the_same_tracks_events_and_counts_as_in_process(assets: Path, clips: list[Path],
                                                                          tmp_path: Path) -> None:
    runs = {}
    for workers in ("0", "2"):
        events = tmp_path / f"w{workers}.jsonl"
        r = run_cli("run", "--model", str(assets / MODEL), *_sources(clips), "--capture", "thread", "--track",
                    "--track-workers", workers, *RULES, "--sink", f"jsonl://{events}", "--json", timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[workers] = (json.loads(r.stdout), _by_source(events))
    (inline, inline_records), (workers, worker_records) = runs["0"], runs["2"]
    assert inline["tracking_workers"] == 0 and workers["tracking_workers"] == 2
    assert sorted(worker_records) == ["0", "1", "2", "3"]
    for name, records in inline_records.items():
        assert worker_records[name] == records, f"source {name} differs"
        assert [r["frame"] for r in records if "detections" in r] == list(range(90))
    assert sum(r.get("type") == "line_cross" for rs in worker_records.values() for r in rs) > 0
    ids = {tuple(d["track_id"] for r in rs if "detections" in r for d in r["detections"])
           for rs in worker_records.values()}
    assert len(ids) == 4  # four different clips: four different track histories (a mix-up would show)
    keys = ("frames", "detections", "tracking", "counts")
    assert [{k: s.get(k) for k in keys} for s in workers["sources"]] == \
        [{k: s.get(k) for k in keys} for s in inline["sources"]]
    assert all(s["tracking"]["tracks"] > 0 for s in workers["sources"])


def _start_looping(assets: Path, clips: list[Path], events: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgert.cli.main", "run", "--model", str(assets / MODEL),
                             *_sources(clips), "--loop", "--capture", "thread", "--track", "--track-workers", "2",
                             *RULES, "--sink", f"jsonl://{events}", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_records(proc: subprocess.Popen[str], events: Path, count: int) -> set[int]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and (not events.exists() or len(events.read_text().splitlines()) < count):
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.2)
    workers = _worker_pids(proc.pid)
    assert len(workers) == 2, workers
    return workers


def test_a_killed_worker_is_the_runs_error_in_one_line(assets: Path, clips: list[Path], tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    proc = _start_looping(assets, clips, events)
    try:
        workers = _wait_for_records(proc, events, 40)
        victim = min(workers)
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        out, err = proc.communicate(timeout=60)  # no hang: the results thread sees the worker gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "tracking worker", "died: killed by SIGKILL")
    assert _gone(workers)


def test_sigterm_stops_the_run_and_leaves_no_worker(assets: Path, clips: list[Path], tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    proc = _start_looping(assets, clips, events)
    try:
        workers = _wait_for_records(proc, events, 40)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["stopped_by"] == "SIGTERM" and summary["tracking_workers"] == 2
    assert all(s["frames"] > 0 and s["tracking"]["tracks"] > 0 for s in summary["sources"])  # the workers' last word
    assert _gone(workers)


def test_what_cannot_apply_is_refused_in_one_line(assets: Path, clips: list[Path], tmp_path: Path) -> None:
    model = str(assets / MODEL)
    assert_one_line_error(run_cli("run", "--model", model, *_sources(clips), "--track", "--track-workers", "5",
                                  "--max-frames", "2"), "track.workers: 5 worker processes for 4 source(s)")
    assert_one_line_error(run_cli("run", "--model", model, *_sources(clips), "--track-workers", "2",
                                  "--max-frames", "2"), "--track-workers: nothing to track")
    assert_one_line_error(run_cli("run", "--model", model, *_sources(clips), "--track", "--track-workers", "-1",
                                  "--max-frames", "2"), "--track-workers: expected 0..64")
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"model: {{path: {model}}}\nsource: {{uri: {clips[0]}}}\ntrack: {{workers: 65}}\n")
    assert_one_line_error(run_cli("run", "--config", str(cfg)), "workers")


def test_the_default_takes_workers_from_eight_sources_on_four_cores_or_more() -> None:
    from edgert.analytics.workers import tracking_worker_count
    from edgert.config import PipelineConfig, TrackConfig

    tracked = PipelineConfig(track=TrackConfig())
    assert tracking_worker_count(PipelineConfig(), 32, cpus=16) == 0  # nothing to track
    assert tracking_worker_count(tracked, 4, cpus=16) == 0
    assert tracking_worker_count(tracked, 8, cpus=2) == 0  # no spare cores: the results thread
    assert tracking_worker_count(tracked, 8, cpus=16) == 2
    assert tracking_worker_count(tracked, 16, cpus=16) == 4
    assert tracking_worker_count(tracked, 32, cpus=16) == 4  # at most a quarter of the cores
    assert tracking_worker_count(PipelineConfig(track=TrackConfig(workers=3)), 4, cpus=2) == 3
