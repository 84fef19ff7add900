"""Issue 25, case 2 continued: a live source still down after ``source.timeout_s`` at start is reconnected in the
background like one lost mid-run, reported as reconnecting, and its frames flow (tagged) once it is up: read on a
capture thread (``capture: thread``) or by a capture worker process (``capture: process``, the default from 4
sources on 4+ cores), which reconnects it itself and tells the run.

The real CLI in a subprocess; the camera is a real HTTP stream of a video (FFmpeg reads it as a live source) that
starts listening only when the test says so; the other source is a looping file.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import pytest

from tests.faults.conftest import Cli, closed_port, free_port, http_get, sources_at_stop
from tests.helpers import assert_one_line_error, run_cli

CAPTURE = pytest.mark.parametrize("capture", ["thread", "process"])


def _metric(metrics: str, line_start: str) -> float | None:
    try:
        _, text = http_get(f"http://{metrics}/metrics", 2.0)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.split()[-1])
    return None


def _wait_metric(metrics: str, line_start: str, value: float, cli: Cli, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _metric(metrics, line_start) == value:
            return
        assert cli.proc.poll() is None, cli.stderr
        time.sleep(0.1)
    raise AssertionError(f"{line_start} did not reach {value} within {timeout} s: {_metric(metrics, line_start)}")


def _lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _wait_for_lines(run: Cli, path: Path, count: int, timeout: float = 60) -> None:
    """Until ``path`` holds ``count`` records (or ``timeout`` passes: the assertions after it say what was missing),
    the run alive all along."""
    deadline = time.monotonic() + timeout
    while len(_lines(path)) < count and time.monotonic() < deadline:
        assert run.proc.poll() is None, run.stderr
        time.sleep(0.1)


def _config(tmp_path: Path, media: dict[str, Path], cam: str, capture: str, track_workers: int | None = None) -> Path:
    cfg = tmp_path / "p.yaml"
    workers = "" if track_workers is None else f", workers: {track_workers}"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   f"track: {{tracker: bytetrack{workers}}}\n"
                   "analytics: {lines: [{name: middle, points: [[0, 0.5], [1, 0.5]]}]}\n"
                   "sources:\n"
                   f"  - {{uri: '{cam}', name: cam, timeout_s: 1.5, capture: {capture}}}\n"
                   f"  - {{uri: '{media['long']}', name: door, loop: true, capture: {capture}}}\n"
                   f"sinks: ['jsonl://{tmp_path}/{{source}}.jsonl', '{tmp_path}/{{source}}.mp4']\n",
                   encoding="utf-8")
    return cfg


def _workers_of(pid: int) -> int:
    """How many capture workers (multiprocessing's spawned children) ``pid`` has now, from /proc."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        count += ppid == pid and b"spawn_main" in cmdline
    return count


@CAPTURE
def test_a_camera_up_after_the_start_is_reconnected_and_its_frames_flow(
        tmp_path: Path, media: dict[str, Path], late_server: tuple[int, threading.Event], capture: str) -> None:
    port, go = late_server
    cfg = _config(tmp_path, media, f"http://127.0.0.1:{port}/{media['long'].name}", capture)
    metrics = f"127.0.0.1:{free_port()}"
    run = Cli("run", "--config", str(cfg), "--json", "--metrics", metrics)
    try:
        run.wait_for("reconnecting it in the background")
        # down: the others run, the camera is reported as reconnecting, and it has no frames
        _wait_metric(metrics, 'edgert_source_reconnecting{source="cam"}', 1.0, run)
        assert _lines(tmp_path / "door.jsonl") and not _lines(tmp_path / "cam.jsonl")
        if capture == "process" and os.path.isdir("/proc/self"):
            # both sources are read by worker processes, the camera's still there while it is down
            assert _workers_of(run.proc.pid) == 2
        go.set()  # the camera comes up
        _wait_for_lines(run, tmp_path / "cam.jsonl", 10)
        _wait_metric(metrics, 'edgert_source_reconnecting{source="cam"}', 0.0, run)
        assert (_metric(metrics, 'edgert_source_reconnects_total{source="cam"}') or 0) >= 1
        run.signal()
        code, out = run.finish(60)
    finally:
        run.kill()
    assert code == 0, run.stderr
    per = {s["name"]: s for s in json.loads(out)["sources"]}
    cam = per["cam"]
    assert cam["capture"] == per["door"]["capture"] == capture
    # the test's camera is a short video over HTTP: at its end it is lost and reconnected again, like a camera
    assert cam["frames"] >= 10 and cam["reconnects"] >= 1
    assert "cannot open" in cam["start_error"] and "error" not in cam
    assert cam["ended"] == "stopped" and "counts" in cam  # its line was resolved on its own first frame
    records = _lines(tmp_path / "cam.jsonl")
    assert len(records) == cam["frames"] and {r["source"] for r in records} == {"cam"}
    video = cv2.VideoCapture(str(tmp_path / "cam.mp4"))
    try:
        assert int(video.get(cv2.CAP_PROP_FRAME_COUNT)) == cam["frames"]
        assert int(video.get(cv2.CAP_PROP_FRAME_WIDTH)) == 96  # sized by its first frame, not at the start
    finally:
        video.release()
    assert f"127.0.0.1:{port}/{media['long'].name}: reconnecting in" in run.stderr and "reconnected" in run.stderr


def test_a_camera_up_after_the_start_is_tracked_by_its_worker(
        tmp_path: Path, media: dict[str, Path], late_server: tuple[int, threading.Event]) -> None:
    """track.workers: a source that came up late gets its stages in its worker on its first frame."""
    port, go = late_server
    cfg = _config(tmp_path, media, f"http://127.0.0.1:{port}/{media['long'].name}", "thread", track_workers=2)
    run = Cli("run", "--config", str(cfg), "--json")
    try:
        run.wait_for("reconnecting it in the background")
        go.set()
        _wait_for_lines(run, tmp_path / "cam.jsonl", 10)
        run.signal()
        code, out = run.finish(60)
    finally:
        run.kill()
    assert code == 0, run.stderr
    summary = json.loads(out)
    cam = {s["name"]: s for s in summary["sources"]}["cam"]
    assert summary["tracking_workers"] == 2 and cam["frames"] >= 10
    assert "counts" in cam and cam["tracking"]["tracks"] > 0  # its worker's figures
    boxes = [d for r in _lines(tmp_path / "cam.jsonl") if "detections" in r for d in r["detections"]]
    assert boxes and all(d["track_id"] >= 0 for d in boxes)


@CAPTURE
def test_a_camera_that_stays_down_is_reported_as_reconnecting(tmp_path: Path, media: dict[str, Path],
                                                                capture: str) -> None:
    cfg = _config(tmp_path, media, f"http://127.0.0.1:{closed_port()}/v.avi", capture)
    run = Cli("run", "--config", str(cfg), "--json")
    try:
        run.wait_for("reconnecting in")  # the background attempts, after the start's
        deadline = time.monotonic() + 60
        while len(_lines(tmp_path / "door.jsonl")) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        run.signal()
        code, out = run.finish(60)
    finally:
        run.kill()
    assert code == 0, run.stderr
    per = {s["name"]: s for s in json.loads(out)["sources"]}
    assert per["cam"]["reconnecting"] is True and per["cam"]["frames"] == 0 and per["cam"]["reconnects"] == 0
    assert "cannot open" in per["cam"]["start_error"] and "error" not in per["cam"]
    assert per["cam"]["capture"] == capture
    assert per["door"]["frames"] > 0
    assert not (tmp_path / "cam.mp4").exists()  # no frame, no video: nothing was made for it


def test_the_run_fails_when_no_source_ever_opens(tmp_path: Path, media: dict[str, Path]) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsources:\n"
                   f"  - {{uri: 'http://127.0.0.1:{closed_port()}/a.avi', name: a, timeout_s: 1}}\n"
                   f"  - {{uri: 'http://127.0.0.1:{closed_port()}/b.avi', name: b, timeout_s: 1}}\n",
                   encoding="utf-8")
    proc = run_cli("run", "--config", str(cfg))
    assert_one_line_error(proc, "no source could be opened", "a: ", "a.avi: cannot open", "b: ", "b.avi")


class _Camera:
    """An HTTP server of the test videos that can go away and come back on its port (a camera rebooting)."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = str(folder)
        self._server: http.server.ThreadingHTTPServer | None = None

    def up(self) -> None:
        folder = self.folder

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=folder, **kwargs)  # type: ignore[arg-type]

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Quiet)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def camera(media: dict[str, Path]) -> Iterator[_Camera]:
    cam = _Camera(media["long"].parent)
    yield cam
    cam.down()


@CAPTURE
def test_a_camera_lost_mid_run_is_reported_as_reconnecting_while_it_is_down(
        tmp_path: Path, media: dict[str, Path], camera: _Camera, capture: str) -> None:
    """Mid-run, no frame comes while a camera is down: with ``capture: process`` its worker reports the state
    between frames, so the metrics say it is reconnecting then, not only at its next frame."""
    camera.up()
    cfg = _config(tmp_path, media, f"http://127.0.0.1:{camera.port}/{media['long'].name}", capture)
    metrics = f"127.0.0.1:{free_port()}"
    run = Cli("run", "--config", str(cfg), "--json", "--metrics", metrics)
    try:
        _wait_for_lines(run, tmp_path / "cam.jsonl", 10)
        camera.down()  # the video being read ends, and every reconnect is refused
        _wait_metric(metrics, 'edgert_source_reconnecting{source="cam"}', 1.0, run)
        frames_while_down = len(_lines(tmp_path / "cam.jsonl"))
        camera.up()
        _wait_for_lines(run, tmp_path / "cam.jsonl", frames_while_down + 10)
        cam = sources_at_stop(run)["cam"]
    finally:
        run.kill()
    assert cam["capture"] == capture and cam["reconnects"] >= 1 and "start_error" not in cam
    assert cam["frames"] >= frames_while_down + 10


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers: cameras stuck in their connect."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed at the test's end
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield int(listener.getsockname()[1])
    listener.close()
    for conn in held:
        conn.close()


def test_many_cameras_stuck_in_connect_stop_within_one_grace_period(
        tmp_path: Path, media: dict[str, Path], silent_server: int) -> None:
    """Six capture workers whose cameras never answer: told to stop together at SIGTERM, they cost one grace
    period (2 s, then a kill) in all, where closing them one by one cost 2 s each and passed the stop deadline."""
    cams = 6
    cfg = tmp_path / "p.yaml"
    lines = [f"  - {{uri: 'http://127.0.0.1:{silent_server}/cam{i}.avi', name: cam{i}, timeout_s: 8, "
             "capture: process}" for i in range(cams)]
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   "sources:\n" + "\n".join(lines) + "\n"
                   f"  - {{uri: '{media['long']}', name: door, loop: true, capture: process}}\n"
                   f"sinks: ['jsonl://{tmp_path}/{{source}}.jsonl']\n", encoding="utf-8")
    run = Cli("run", "--config", str(cfg), "--json")
    try:
        deadline = time.monotonic() + 90
        while run.stderr.count("reconnecting it in the background") < cams and time.monotonic() < deadline:
            assert run.proc.poll() is None, run.stderr
            time.sleep(0.1)
        _wait_for_lines(run, tmp_path / "door.jsonl", 5)
        time.sleep(1.0)  # each worker is in its next connect attempt now, which will not return for 8 s
        asked = time.monotonic()
        run.signal()
        code, out = run.finish(60)
        took = time.monotonic() - asked
    finally:
        run.kill()
    assert code == 0, run.stderr
    assert took < 6.0, f"stopping took {took:.1f} s: {run.stderr[-2000:]}"
    per = {s["name"]: s for s in json.loads(out)["sources"]}
    assert per["door"]["frames"] >= 5 and all(per[f"cam{i}"]["frames"] == 0 for i in range(cams))
