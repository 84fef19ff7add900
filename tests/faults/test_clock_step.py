"""A wall-clock step during a run does not reach the analytics of a live source (media time, track ages, dwell).

NTP setting the time at boot on a Jetson without an RTC steps the wall clock by hours. Live sources' media time
was that wall clock, so a zone's dwell came out 21 660 s instead of 58 after +1 h. Now it is a monotonic clock
(:mod:`edgert.io.capture_clock`). The real CLI runs on a live HTTP stream with a tracker and a zone over the whole
frame; its process's wall clock (Python's ``time.time``, which every wall-clock read of edgert goes through) is
stepped by an hour mid-run from outside, through a file, without touching the machine's clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.faults.conftest import Cli
from tests.faults.test_late_source import _lines, _wait_for_lines
from tests.helpers import ROOT

_STEPPED = """
import os, runpy, sys, time
real, path, state = time.time, os.environ["EDGERT_TEST_STEP_FILE"], {"next": 0.0, "offset": 0.0}
def stepped():
    now = time.monotonic()
    if now >= state["next"]:
        state["next"] = now + 0.05
        try:
            with open(path) as f:
                state["offset"] = float(f.read() or 0)
        except (OSError, ValueError):
            pass
    return real() + state["offset"]
time.time = stepped
sys.argv = ["edgert", *sys.argv[1:]]
runpy.run_module("edgert.cli.main", run_name="__main__")
"""


class SteppedCli(Cli):
    """The CLI in a process whose wall clock the test steps by writing seconds into ``step``."""

    def __init__(self, step: Path, *args: str) -> None:
        import threading as _threading

        self.proc = subprocess.Popen([sys.executable, "-c", _STEPPED, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, "EDGERT_TEST_STEP_FILE": str(step)})
        self.lines: list[str] = []
        self._reader = _threading.Thread(target=self._read, daemon=True)
        self._reader.start()


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_wall_clock_step_does_not_reach_media_time_or_track_ages(
        tmp_path: Path, media: dict[str, Path], late_server: tuple[int, threading.Event], step_s: float) -> None:
    port, go = late_server
    go.set()
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   "track: {tracker: bytetrack}\n"
                   "analytics: {zones: [{name: all, polygon: [[0, 0], [1, 0], [1, 1], [0, 1]]}]}\n"
                   f"source: {{uri: 'http://127.0.0.1:{port}/{media['long'].name}', name: cam}}\n"
                   f"sinks: ['jsonl://{tmp_path}/events.jsonl']\n", encoding="utf-8")
    step = tmp_path / "step"
    step.write_text("0")
    started = time.monotonic()
    run = SteppedCli(step, "run", "--config", str(cfg), "--json")
    try:
        _wait_for_lines(run, tmp_path / "events.jsonl", 30)
        step.write_text(repr(step_s))
        before = len(_lines(tmp_path / "events.jsonl"))
        _wait_for_lines(run, tmp_path / "events.jsonl", before + 30)
        run.signal()
        code, out = run.finish(60)
    finally:
        run.kill()
    took = time.monotonic() - started
    assert code == 0, run.stderr
    summary = json.loads(out)
    records = _lines(tmp_path / "events.jsonl")
    stamps = [float(r["timestamp"]) for r in records if "timestamp" in r]
    # the written timestamps follow the wall clock, step and all (what a reader of them wants)
    assert max(stamps) - min(stamps) >= abs(step_s) - 1
    cam = summary["sources"][0]
    assert cam["time_base"] == "capture clock"
    # media time and track ages: the run's own length, not an hour more (or less)
    assert 0 < cam["media_s"] <= took and 0 < cam["tracking"]["mean_track_s"] <= took, (cam, took)
    times = [float(r["time"]) for r in records if "type" in r and "time" in r]
    assert times == sorted(times), times  # event times never run backwards

