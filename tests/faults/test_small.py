"""Issue 25, case 11: the smaller ones, each through the real CLI."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.faults.conftest import Cli, free_port, http_get
from tests.helpers import assert_one_line_error, run_cli


def test_threads_have_an_upper_bound(media: dict[str, Path]) -> None:
    proc = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]), "--threads", "100000")
    assert_one_line_error(proc, "threads", "expected a count from 0 to 256")


def test_metrics_are_announced_only_once_bound(media: dict[str, Path]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        refused = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]),
                          "--metrics", f"127.0.0.1:{port}")
    assert_one_line_error(refused, f"cannot listen on 127.0.0.1:{port}")
    assert "metrics at" not in refused.stderr  # never announced: it was never there
    port = free_port()
    run = Cli("run", "--model", str(media["model"]), "--source", str(media["long"]), "--loop",
              "--metrics", f"127.0.0.1:{port}")
    try:
        run.wait_for(f"metrics at http://127.0.0.1:{port}/metrics")
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")  # announced once bound: it answers
        assert status == 200 and "edgert_frames_total" in body
    finally:
        run.signal()
        run.finish(30)
        run.kill()


def test_nan_points_and_unknown_classes_are_refused(tmp_path: Path, media: dict[str, Path]) -> None:
    base = f"model: {{path: {media['model']}}}\nsource: {{uri: '{media['video']}'}}\ntrack: {{tracker: bytetrack}}\n"
    nan = tmp_path / "nan.yaml"
    nan.write_text(base + "analytics: {lines: [{name: a, points: [[0, .nan], [10, 10]]}]}\n", encoding="utf-8")
    assert_one_line_error(run_cli("run", "--config", str(nan)), "points", "finite")
    zone = tmp_path / "zone.yaml"
    zone.write_text(base + "analytics: {zones: [{name: z, polygon: [[0, 0], [.inf, 0], [5, 5]]}]}\n",
                    encoding="utf-8")
    assert_one_line_error(run_cli("run", "--config", str(zone)), "polygon", "finite")
    typo = tmp_path / "typo.yaml"
    out = tmp_path / "e.jsonl"
    out.write_text("old\n")
    typo.write_text(base + "analytics: {lines: [{name: a, points: [[0, 5], [10, 5]], classes: [persn]}]}\n"
                    f"sinks: ['jsonl://{out}']\n", encoding="utf-8")
    assert_one_line_error(run_cli("run", "--config", str(typo)), "line a: unknown class 'persn'")
    assert out.read_text() == "old\n"


def test_the_report_embeds_any_name_safely(tmp_path: Path, media: dict[str, Path]) -> None:
    evil = "<!--<script>alert(1)</script>"
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsources:\n  - {{uri: '{media['video']}', name: '{evil}'}}\n"
                   f"  - {{uri: '{media['video']}', name: b}}\n", encoding="utf-8")
    report = tmp_path / "r.html"
    proc = run_cli("run", "--config", str(cfg), "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    html = report.read_text(encoding="utf-8")
    blob = html.split('<script type="application/json" id="edgert-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in blob and ">" not in blob  # nothing in it can end or reopen the element
    assert evil in json.dumps(json.loads(blob), ensure_ascii=False)  # and the data is the same


def _yolo_set(tmp_path: Path, label: bytes) -> tuple[Path, Path]:
    import cv2
    import numpy as np

    images, labels = tmp_path / "images", tmp_path / "labels"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    cv2.imwrite(str(images / "a.jpg"), np.full((32, 32, 3), 90, np.uint8))
    (labels / "classes.txt").write_text("class0\nclass1\n")  # the tiny model's own names
    (labels / "a.txt").write_bytes(label)
    return images, labels


def test_val_refuses_undecodable_and_impossible_labels(tmp_path: Path, media: dict[str, Path]) -> None:
    cases = [(b"0 0.5 0.5 0.2 0.2 \xff\xfe\n", "not UTF-8"), (b"0 nan 0.5 0.2 0.2\n", "a.txt:1"),
             (b"1 0.5 0.5 3.0 0.2\n", "a.txt:1"), (b"0 0.5 0.5 0 0.2\n", "a.txt:1")]
    for i, (label, needle) in enumerate(cases):
        images, labels = _yolo_set(tmp_path / str(i), label)
        proc = run_cli("val", str(media["model"]), "--images", str(images), "--labels", str(labels))
        assert_one_line_error(proc, needle)
    fine, labels = _yolo_set(tmp_path / "fine", b"0 0.5 0.5 0.25 0.25\n")
    ok = run_cli("val", str(media["model"]), "--images", str(fine), "--labels", str(labels), "--json")
    assert ok.returncode == 0, ok.stderr


def test_the_frames_folder_is_locked_and_its_removal_noticed(tmp_path: Path, media: dict[str, Path]) -> None:
    import time

    frames = tmp_path / "frames"
    first = Cli("-v", "run", "--model", str(media["model"]), "--source", str(media["long"]), "--loop",
                "--sink", f"{frames}/")
    try:
        first.wait_for("opened video")
        second = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]),
                         "--sink", f"{frames}/")
        assert_one_line_error(second, "is writing this file (locked)")
        deadline = time.monotonic() + 30
        while len(list(frames.glob("*.jpg"))) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        frames.rename(tmp_path / "moved")  # taken away under the running sink: not silently made again
        code, _ = first.finish(60)
    finally:
        first.kill()
    errors = [line for line in first.stderr.splitlines() if line.startswith("edgert: error:")]
    assert code == 1 and len(errors) == 1 and str(frames) in errors[0], first.stderr
    # "the folder was removed" or, when the move fell between the check and a write, that write's failure
    assert "the folder was removed during the run" in errors[0] or "cannot write the image" in errors[0]
    assert not frames.exists() or not list(frames.glob("*.jpg"))  # nothing carried on in a folder made anew
