"""Sinks under faults: outputs a failed start leaves alone, one writer per file, failures that stop the run.

Through the real CLI in subprocesses with real files, /dev/full, a tmpfs filled up in a private mount
namespace, a deleted folder and a taken port.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgert.errors import SinkError
from edgert.io.sinks import FrameResult, JsonlSink, Sink, SinkWorker, StreamInfo, prepare_sinks
from edgert.vision.detections import Detections
from tests.helpers import ROOT, assert_one_line_error, run_cli
from tests.pipeline.media import make_video, tiny_detector

cv2 = pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

TIMEOUT = 90
INFO = StreamInfo(96, 64, 10.0, ("person", "car"))


def _det() -> Detections:
    return Detections(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), np.array([0.5], np.float32),
                      np.array([0]), ("person", "car"))


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sink-faults")
    return {"root": root, "video": make_video(root / "v.avi", frames=30, size=(96, 64)),
            "model": tiny_detector(root / "tiny.onnx")}


def _run_args(media: dict[str, Path], *sinks: str, loop: bool = False) -> list[str]:
    args = ["run", "--model", str(media["model"]), "--source", str(media["video"])]
    for sink in sinks:
        args += ["--sink", sink]
    return [*args, "--loop"] if loop else args


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgert.cli.main", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_lines(path: Path, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"{path} got no events within {timeout} s")


def _whole_lines(path: Path) -> list[dict[str, object]]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.splitlines()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- a run that does not start destroys nothing --------------------------------------------------------


def test_taken_port_leaves_existing_outputs_untouched(media: dict[str, Path], tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    video = tmp_path / "out.mp4"
    events.write_bytes(b'{"frame":0}\n' * 1000)
    video.write_bytes(os.urandom(50_000))
    before = (events.read_bytes(), video.read_bytes())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = run_cli(*_run_args(media, f"jsonl://{events}", str(video), f"http://127.0.0.1:{port}"), timeout=TIMEOUT)
    assert_one_line_error(r, f"127.0.0.1:{port}", "cannot listen")
    assert (events.read_bytes(), video.read_bytes()) == before
    new = tmp_path / "new.jsonl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        r = run_cli(*_run_args(media, f"jsonl://{new}", f"http://127.0.0.1:{taken.getsockname()[1]}"),
                    timeout=TIMEOUT)
    assert r.returncode == 1 and not new.exists()  # a file the failed start created is removed again


def test_prepare_binds_the_port_and_close_releases_it() -> None:
    port = _free_port()
    sinks = prepare_sinks([f"http://127.0.0.1:{port}"])
    with socket.socket() as probe, pytest.raises(OSError):
        probe.bind(("127.0.0.1", port))
    assert sinks[0].url == f"http://127.0.0.1:{port}/"  # type: ignore[attr-defined]
    sinks[0].close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_prepare_failure_releases_the_sinks_before_it(tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text("kept\n")
    with pytest.raises(SinkError, match="unknown sink"):
        prepare_sinks([f"jsonl://{events}", "nonsense://x"])
    assert events.read_text() == "kept\n"
    again = JsonlSink(f"jsonl://{events}", str(events))  # the lock was released with the failed prepare
    again.open(INFO)
    again.close()
    assert events.read_text() == ""


# -- one writer per file -------------------------------------------------------------------------------


def test_second_run_on_one_jsonl_fails_naming_the_first(media: dict[str, Path], tmp_path: Path) -> None:
    events = tmp_path / "shared.jsonl"
    first = _spawn(_run_args(media, f"jsonl://{events}", loop=True))
    try:
        _wait_for_lines(events, first)
        r = run_cli(*_run_args(media, f"jsonl://{events}"), timeout=TIMEOUT)
        assert_one_line_error(r, "shared.jsonl", f"process {first.pid}", "locked")
    finally:
        first.send_signal(signal.SIGINT)
        _out, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    lines = _whole_lines(events)
    assert [e["frame"] for e in lines] == list(range(len(lines)))  # one writer: in order, nothing mixed in


def test_two_sinks_on_one_file_are_refused(media: dict[str, Path], tmp_path: Path) -> None:
    events = tmp_path / "twice.jsonl"
    r = run_cli(*_run_args(media, f"jsonl://{events}", f"jsonl://{events}"), timeout=TIMEOUT)
    assert_one_line_error(r, "two sinks of this run write the same file")


# -- failures mid-run are errors -----------------------------------------------------------------------


def test_dev_full_is_an_error(media: dict[str, Path]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full is not available here")
    r = run_cli(*_run_args(media, "jsonl:///dev/full"), timeout=TIMEOUT)
    assert_one_line_error(r, "/dev/full", "No space left on device")


def _in_full_tmpfs(mount: Path, args: list[str], size: str = "200k") -> subprocess.CompletedProcess[str]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    # As root a private mount namespace; otherwise one inside a user namespace (-r) where the user may mount.
    for unshare in (["unshare", "-m"], ["unshare", "-r", "-m"]):
        probe = subprocess.run([*unshare, "--propagation", "private", "sh", "-c",
                                f"mount -t tmpfs -o size=4k tmpfs {mount}"], capture_output=True, text=True)
        if probe.returncode == 0:
            break
    else:
        pytest.skip(f"a private mount namespace is not permitted here: {probe.stderr.strip()}")
    # The run writes into the small tmpfs; what it left is copied out before the namespace (and mount) goes.
    command = " ".join([sys.executable, "-m", "edgert.cli.main", *(f"'{a}'" for a in args)])
    script = (f"mount -t tmpfs -o size={size} tmpfs {mount} && cd {ROOT} && {command}; rc=$?; "
              f"cp -r {mount}/. {mount}.after/ 2>/dev/null; exit $rc")
    os.makedirs(f"{mount}.after", exist_ok=True)
    return subprocess.run([*unshare, "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=TIMEOUT)


def test_full_disk_jsonl_fails_and_ends_on_a_whole_line(media: dict[str, Path], tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    r = _in_full_tmpfs(mount, _run_args(media, f"jsonl://{mount}/events.jsonl", loop=True))
    assert_one_line_error(r, "events.jsonl", "No space left on device")
    lines = _whole_lines(Path(f"{mount}.after") / "events.jsonl")
    assert len(lines) > 100 and [e["frame"] for e in lines] == list(range(len(lines)))


@pytest.mark.parametrize("suffix", [".avi", ".mp4"])
def test_full_disk_video_fails_and_is_released(media: dict[str, Path], tmp_path: Path, suffix: str) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    r = _in_full_tmpfs(mount, _run_args(media, f"{mount}/out{suffix}", loop=True), size="2m")
    assert_one_line_error(r, f"out{suffix}", "No space left on device", "stopped and finalised")
    cap = cv2.VideoCapture(str(Path(f"{mount}.after") / f"out{suffix}"))
    frames = 0
    while cap.read()[0]:
        frames += 1
    cap.release()
    written = int(r.stderr.rsplit("at frame ", 1)[1].split()[0])
    assert frames == written > 10  # every frame it says it wrote plays back: the index was written


def test_deleted_folder_mid_run_is_an_error(media: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "outs"
    events = folder / "events.jsonl"
    proc = _spawn(_run_args(media, f"jsonl://{events}", loop=True))
    try:
        _wait_for_lines(events, proc)
        shutil.rmtree(folder)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "events.jsonl: the file was deleted while the run wrote it" in err


# -- the worker's failure record -----------------------------------------------------------------------


class _FailsAt(Sink):
    def __init__(self, at: int) -> None:
        super().__init__("fails://")
        self.at = at
        self.written: list[int] = []
        self.closes = 0

    def open(self, info: StreamInfo) -> None:
        pass  # this sink fails on writes, not at open

    def write(self, result: FrameResult) -> None:
        if result.index == self.at:
            raise OSError(28, "No space left on device")
        self.written.append(result.index)

    def close(self) -> None:
        self.closes += 1


def test_worker_records_failure_counts_lost_and_stops_accepting() -> None:
    sink = _FailsAt(3)
    calls: list[SinkWorker] = []
    worker = SinkWorker(sink, on_failure=calls.append)
    worker.start()
    accepted = []
    for i in range(10):
        accepted.append(worker.offer(FrameResult(i, 0.0, _det())))
        time.sleep(0.02)
    worker.close()
    assert sink.written == [0, 1, 2]
    assert worker.failed and str(worker.error) == "fails://: writing failed: No space left on device"
    assert worker.lost == 7 and worker.written == 3 and worker.dropped == 0
    assert calls == [worker] and sink.closes >= 1  # closed (finalised) when it failed, not only at the end
    assert not any(accepted[5:])


def test_jsonl_write_failure_cuts_back_to_the_last_line(tmp_path: Path) -> None:
    """A real partial write: RLIMIT_FSIZE stops the file mid-line (in a child, so the limit stays there)."""
    events = tmp_path / "e.jsonl"
    code = f"""
import resource, signal, numpy as np
from edgert.io.sinks import JsonlSink, FrameResult, StreamInfo
from edgert.vision.detections import Detections
from edgert.errors import SinkError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
sink = JsonlSink("jsonl://x", {str(events)!r})
sink.open(StreamInfo(8, 8))
det = Detections(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), np.array([0.5], np.float32), np.array([0]), ("a",))
try:
    for i in range(100):
        sink.write(FrameResult(i, 0.0, det))
except SinkError as exc:
    print(exc)
sink.close()
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "writing events failed: File too large" in r.stdout, r.stderr
    lines = _whole_lines(events)
    assert len(lines) > 0 and events.stat().st_size <= 1000
