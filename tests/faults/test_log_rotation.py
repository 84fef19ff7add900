"""A JSONL sink under logrotate: ``copytruncate`` leaves no NUL bytes, ``create`` + SIGHUP moves to the new file.

Before: the sink wrote at its own offset, so after logrotate's ``copytruncate`` the next line landed past a hole of
NUL bytes (126 KB of them); in ``create`` mode it kept writing into the rotated file; SIGHUP (``postrotate``) killed
the run without finishing its files. logrotate's two modes are done here with the same system calls logrotate
makes (copy then truncate in place; rename, then create the new file), on a real run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from tests.faults.conftest import Cli
from tests.faults.test_late_source import _lines, _wait_for_lines


def _run(tmp_path: Path, media: dict[str, Path]) -> Cli:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   f"source: {{uri: '{media['long']}', loop: true, realtime: true}}\n"
                   f"sinks: ['jsonl://{tmp_path}/events.jsonl']\n", encoding="utf-8")
    return Cli("run", "--config", str(cfg), "--json")


def _whole_lines(path: Path) -> list[dict[str, object]]:
    data = path.read_bytes()
    nul = data.count(0)
    assert not nul, f"{path.name} has {nul} NUL bytes"
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line]


def test_copytruncate_leaves_no_hole(tmp_path: Path, media: dict[str, Path]) -> None:
    events = tmp_path / "events.jsonl"
    run = _run(tmp_path, media)
    try:
        _wait_for_lines(run, events, 20)
        shutil.copyfile(events, tmp_path / "events.jsonl.1")  # logrotate copytruncate: copy, then truncate in place
        os.truncate(events, 0)
        _wait_for_lines(run, events, 10)
        run.signal()
        code, _ = run.finish(60)
    finally:
        run.kill()
    assert code == 0, run.stderr
    assert len(_whole_lines(events)) >= 10 and len(_whole_lines(tmp_path / "events.jsonl.1")) >= 20


def test_create_mode_and_sighup_move_to_the_new_file(tmp_path: Path, media: dict[str, Path]) -> None:
    events, rotated = tmp_path / "events.jsonl", tmp_path / "events.jsonl.1"
    run = _run(tmp_path, media)
    try:
        _wait_for_lines(run, events, 20)
        os.rename(events, rotated)  # logrotate create: rename, create the new file, then postrotate's SIGHUP
        events.touch()
        run.signal(signal.SIGHUP)
        run.wait_for("SIGHUP: file sinks open their paths again")
        _wait_for_lines(run, events, 10)
        at_rotation = len(_lines(rotated))
        _wait_for_lines(run, events, len(_lines(events)) + 10)
        assert len(_lines(rotated)) == at_rotation  # nothing more went to the rotated file
        assert run.proc.poll() is None  # SIGHUP did not stop the run
        run.signal()
        code, out = run.finish(60)
    finally:
        run.kill()
    assert code == 0, run.stderr
    frames = [r["frame"] for r in _whole_lines(rotated) + _whole_lines(events)]
    assert frames == list(range(len(frames)))  # every frame once, in order, across the two files
    assert json.loads(out)["frames"] == len(frames)
