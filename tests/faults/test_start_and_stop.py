"""Issue 25, cases 2 to 5 (and #23's slow camera): starting with a source down, signals in every window,
a failed start, a second signal while the sinks close. The real CLI in a subprocess, real files and sockets.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.faults.conftest import Cli, closed_port
from tests.helpers import assert_one_line_error, run_cli

OLD = '{"old": "output of the previous run"}\n'


def _outputs(tmp_path: Path, *names: str) -> list[Path]:
    paths = [tmp_path / name for name in names]
    for path in paths:
        path.write_text(OLD, encoding="utf-8")
    return paths


def test_one_source_down_at_start_does_not_stop_the_others(tmp_path: Path, media: dict[str, Path]) -> None:
    gone_out, door_out = _outputs(tmp_path, "gone.jsonl", "door.jsonl")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsources:\n"
                   f"  - {{uri: '{tmp_path}/missing.avi', name: gone}}\n"
                   f"  - {{uri: '{media['video']}', name: door}}\n"
                   f"sinks: ['jsonl://{tmp_path}/{{source}}.jsonl']\n", encoding="utf-8")
    proc = run_cli("run", "--config", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    per = {s["name"]: s for s in json.loads(proc.stdout)["sources"]}
    assert per["door"]["frames"] == 40 and len(door_out.read_text().splitlines()) == 40
    assert per["gone"]["ended"] == "error" and "video file not found" in per["gone"]["error"]
    assert per["gone"]["frames"] == 0
    assert gone_out.read_text() == OLD  # the missing source's output is left alone
    assert "source gone did not open" in proc.stderr and "goes on with the 1 other" in proc.stderr


def test_no_source_opening_fails_naming_each(tmp_path: Path, media: dict[str, Path]) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsources:\n"
                   f"  - {{uri: '{tmp_path}/a.avi', name: a}}\n  - {{uri: '{tmp_path}/b.avi', name: b}}\n",
                   encoding="utf-8")
    proc = run_cli("run", "--config", str(cfg))
    assert_one_line_error(proc, "no source could be opened", "a: ", "a.avi: video file not found", "b: ")


def test_a_stream_not_up_yet_is_retried_at_start(tmp_path: Path, media: dict[str, Path],
                                                 late_server: tuple[int, threading.Event]) -> None:
    port, go = late_server
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   f"source: {{uri: 'http://127.0.0.1:{port}/{media['video'].name}', timeout_s: 30}}\n"
                   f"runtime: {{max_frames: 5}}\nsinks: ['jsonl://{tmp_path}/e.jsonl']\n", encoding="utf-8")
    run = Cli("-v", "run", "--config", str(cfg), "--json")  # -v: each start-up attempt is logged
    try:
        run.wait_for("retrying in")
        go.set()  # the camera comes up while edgert waits for it
        code, out = run.finish(60)
    finally:
        run.kill()
    assert code == 0, run.stderr
    assert json.loads(out)["frames"] == 5 and len((tmp_path / "e.jsonl").read_text().splitlines()) == 5


def test_a_stream_that_never_comes_up_fails_after_its_timeout(tmp_path: Path, media: dict[str, Path]) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   f"source: {{uri: 'http://127.0.0.1:{closed_port()}/v.avi', timeout_s: 1.5}}\n", encoding="utf-8")
    proc = run_cli("run", "--config", str(cfg))
    assert_one_line_error(proc, "cannot open", "attempts in 1.5 s")


def test_sigterm_during_start_up_leaves_the_previous_outputs(tmp_path: Path, media: dict[str, Path]) -> None:
    jsonl, = _outputs(tmp_path, "e.jsonl")
    video = tmp_path / "out.mp4"
    video.write_bytes(b"previous video" * 100)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   f"source: {{uri: 'http://127.0.0.1:{closed_port()}/v.avi', timeout_s: 120}}\n"
                   f"sinks: ['jsonl://{jsonl}', '{video}']\n", encoding="utf-8")
    run = Cli("-v", "run", "--config", str(cfg), "--json")  # -v: each start-up attempt is logged
    try:
        run.wait_for("retrying in")  # still starting: the camera is not up
        run.signal(signal.SIGTERM)
        code, out = run.finish(30)
    finally:
        run.kill()
    assert code == 0, run.stderr
    assert json.loads(out)["stopped_by"] == "SIGTERM"
    assert jsonl.read_text() == OLD and video.read_bytes() == b"previous video" * 100


def test_a_failed_start_leaves_every_output(tmp_path: Path, media: dict[str, Path]) -> None:
    jsonl, = _outputs(tmp_path, "e.jsonl")
    video = tmp_path / "out.mp4"
    video.write_bytes(b"previous video")
    for bad, needle in (("/proc/edgert-no-such/frames/", "cannot make the folder"),
                        ("mqtt://no-such-host.invalid:1883/edgert/t", "cannot resolve the broker host")):
        if bad.startswith("mqtt"):
            pytest.importorskip("paho.mqtt.client")
        proc = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]),
                       "--sink", f"jsonl://{jsonl}", "--sink", str(video), "--sink", bad)
        assert_one_line_error(proc, needle)
        assert jsonl.read_text() == OLD and video.read_bytes() == b"previous video"


def test_a_second_signal_while_sinks_close_still_finalises_the_video(tmp_path: Path, media: dict[str, Path]) -> None:
    pytest.importorskip("paho.mqtt.client")
    cv2 = pytest.importorskip("cv2")
    video = tmp_path / "out.mp4"
    # A broker nobody runs: every message stays unacknowledged and the MQTT close would wait 60 s for them.
    mqtt = f"mqtt://127.0.0.1:{closed_port()}/edgert/t?close_timeout=60"
    run = Cli("-v", "run", "--model", str(media["model"]), "--source", str(media["long"]), "--loop",
              "--sink", str(video), "--sink", mqtt, "--json")
    try:
        run.wait_for("opened video")
        time.sleep(1.0)  # frames flow
        run.signal(signal.SIGTERM)
        run.wait_for("finishing the frames in flight")
        time.sleep(1.0)  # now in the close, waiting for acknowledgements that never come
        run.signal(signal.SIGTERM)
        code, out = run.finish(30)
    finally:
        run.kill()
    assert code == 0, run.stderr
    assert "stopping now" in run.stderr and "not acknowledged" in run.stderr
    cap = cv2.VideoCapture(str(video))
    frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    assert frames > 0 and frames == json.loads(out)["frames"], run.stderr


@pytest.mark.parametrize("name", ["../up", "/abs", "a?x=1", "b#c", "a b", ".."])
def test_source_names_that_would_escape_the_sink_are_refused(tmp_path: Path, media: dict[str, Path],
                                                            name: str) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsources:\n"
                   f"  - {{uri: '{media['video']}', name: '{name}'}}\n  - {{uri: '{media['video']}', name: ok}}\n"
                   f"sinks: ['jsonl://{tmp_path}/out/{{source}}.jsonl']\n", encoding="utf-8")
    proc = run_cli("run", "--config", str(cfg))
    assert_one_line_error(proc, f"source name {name!r} cannot fill {{source}}")
    assert not (tmp_path / "up.jsonl").exists() and not (tmp_path / "out").exists()
