"""Frame capture in worker processes: every frame in order through the shared ring, the same detections as the
in-process capture, a killed worker is its source's failure alone, SIGTERM leaves no process and no shared memory.

Real videos written with OpenCV, real worker processes (spawned), a real detector from the assets, the CLI in a
subprocess where a user would type it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig, SourceConfig
from edgert.errors import ConfigError, SourceError
from edgert.io.capture import choose_capture
from edgert.io.sinks import FrameResult, Sink, StreamInfo
from edgert.io.sources.gstreamer import jetson_file_pipeline
from edgert.pipeline import Pipeline
from tests.pipeline.media import make_video, tiny_detector

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

COUNTS = (23, 17, 31, 9)


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("capture")
    videos = [make_video(root / f"v{i}.avi", frames=n, size=(96 + 16 * i, 64)) for i, n in enumerate(COUNTS)]
    long = [make_video(root / f"long{i}.avi", frames=400, size=(64, 48)) for i in range(3)]
    return {"root": root, "videos": videos, "long": long, "model": tiny_detector(root / "t.onnx")}


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _frames(source: Any) -> list[str]:
    digests, out = [], None
    with source:
        while True:
            frame = source.read(out)
            if frame is None:
                return digests
            digests.append(hashlib.sha1(np.ascontiguousarray(frame).tobytes()).hexdigest())
            out = frame


def test_a_worker_delivers_the_same_frames_in_order_as_the_in_process_capture(media: dict[str, Any]) -> None:
    from edgert.io.capture.process import ProcessCaptureSource
    from edgert.io.sources import open_source

    video = str(media["videos"][2])
    before = _shm()
    theirs = _frames(ProcessCaptureSource(SourceConfig(uri=video)))
    ours = _frames(open_source(video))
    assert len(ours) == COUNTS[2]
    assert theirs == ours  # byte for byte, frame for frame
    assert _shm() - before == set()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgert.cli.main", "run", *args], capture_output=True, text=True,
                          timeout=300)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _clips(assets: Path, root: Path) -> list[Path]:
    """Four short clips of a real street video, cut with OpenCV (different scenes, so different detections)."""
    import cv2

    cap = cv2.VideoCapture(str(assets / "video" / "vtest.avi"))
    frames = []
    while len(frames) < 160:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    clips = []
    for i, (start, n) in enumerate(((0, 12), (40, 7), (80, 10), (120, 5))):
        path = root / f"clip{i}.avi"
        h, w = frames[0].shape[:2]
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (w // 2, h // 2))
        for frame in frames[start:start + n]:
            writer.write(cv2.resize(frame, (w // 2, h // 2)))
        writer.release()
        clips.append(path)
    return clips


def test_four_file_sources_in_workers_give_every_frame_tagged_with_the_same_detections(
        assets: Path, media: dict[str, Any], tmp_path: Path) -> None:
    clips = _clips(assets, tmp_path)
    model = assets / "models" / "detection" / "nanodet-m-416-coco-v8layout.onnx"
    args = [a for c in clips for a in ("--source", str(c))]
    runs = {}
    before = _shm()
    for mode in ("thread", "process"):
        events = tmp_path / f"{mode}.jsonl"
        proc = _cli("--model", str(model), "--backend", "onnxruntime", *args, "--capture", mode,
                    "--sink", f"jsonl://{events}", "--json")
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout)
        assert summary["frames"] == 12 + 7 + 10 + 5
        runs[mode] = _lines(events)
    for i, n in enumerate((12, 7, 10, 5)):
        mine = {mode: [r for r in lines if r["source"] == str(i)] for mode, lines in runs.items()}
        assert [r["frame"] for r in mine["process"]] == list(range(n))  # every frame of each, in order
        assert [r["detections"] for r in mine["process"]] == [r["detections"] for r in mine["thread"]]
    assert any(r["detections"] for r in runs["process"])  # a real scene: people found
    assert _shm() - before == set()


class _KillAt(Sink):
    """Kills source 1's capture worker (SIGKILL) when its frame ``at`` reaches the sinks."""

    lossless = True

    def __init__(self, sources: list[Any], at: int) -> None:
        super().__init__("kill://")
        self.sources, self.at = sources, at
        self.seen: dict[str, int] = {}

    def open(self, info: StreamInfo) -> None:
        pass

    def write(self, result: FrameResult) -> None:
        name = str(result.source)
        self.seen[name] = self.seen.get(name, 0) + 1
        if name == "1" and result.index == self.at:
            pid = self.sources[1].worker_pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)


def test_a_killed_worker_is_that_sources_failure_and_the_others_go_on(media: dict[str, Any]) -> None:
    from edgert.io.capture.process import ProcessCaptureSource

    sources = [ProcessCaptureSource(SourceConfig(uri=str(v))) for v in media["long"]]
    sink = _KillAt(sources, at=20)
    config = PipelineConfig(model=ModelConfig(path=str(media["model"])))
    before = _shm()
    summary = Pipeline(config, sources=sources, sinks=[sink], handle_signals=False).run()
    per = {s["name"]: s for s in summary["sources"]}
    assert per["0"]["frames"] == per["2"]["frames"] == 400 and per["0"]["ended"] == "end of input"
    assert per["1"]["ended"] == "error" and "killed by SIGKILL" in per["1"]["error"]
    assert 20 < per["1"]["frames"] < 400
    assert sink.seen["1"] == per["1"]["frames"]
    assert all(s.worker_pid is None for s in sources)  # closed: joined
    assert _shm() - before == set()


class _Threads(Sink):
    """Names every capture thread alive while frames reach the sinks, and each source's frame numbers."""

    lossless = True

    def __init__(self) -> None:
        super().__init__("threads://")
        self.names: set[str] = set()
        self.frames: dict[str, list[int]] = {}

    def open(self, info: StreamInfo) -> None:
        pass

    def write(self, result: FrameResult) -> None:
        import threading

        self.names |= {t.name for t in threading.enumerate() if t.name.startswith("edgert-capture")}
        self.frames.setdefault(str(result.source), []).append(result.index)


def test_worker_file_sources_share_one_capture_thread_and_keep_a_frame_per_slot(media: dict[str, Any]) -> None:
    """The collector: three worker-decoded files read by one thread, every frame of each in order; each source
    keeps one frame per slot in the pipeline (its worker's ring holds the frames read ahead)."""
    from edgert.io.capture.process import ProcessCaptureSource

    sources = [ProcessCaptureSource(SourceConfig(uri=str(v))) for v in media["long"]]
    sink = _Threads()
    config = PipelineConfig(model=ModelConfig(path=str(media["model"])), runtime=RuntimeConfig(max_frames=120))
    summary = Pipeline(config, sources=sources, sinks=[sink], handle_signals=False).run()
    assert sink.names == {"edgert-capture"}
    assert sink.frames == {str(i): list(range(120)) for i in range(3)}
    assert [s["ended"] for s in summary["sources"]] == ["max_frames"] * 3
    assert summary["frames_in_flight"] == 3 * summary["slots"]


def _children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(x) for x in text.split()}


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def test_sigterm_stops_the_workers_and_leaves_no_shared_memory(media: dict[str, Any], tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    args = [a for v in media["long"] for a in ("--source", str(v))]
    before = _shm()
    proc = subprocess.Popen([sys.executable, "-m", "edgert.cli.main", "run", "--model", str(media["model"]), *args,
                             "--loop", "--capture", "process", "--sink", f"jsonl://{events}", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not events.exists() or len(events.read_text().splitlines()) < 60):
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.2)
        workers = _children(proc.pid)
        assert len(workers) >= 3  # the three capture workers (and multiprocessing's resource tracker)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["stopped_by"] == "SIGTERM"
    assert all(s["frames"] > 0 for s in summary["sources"])
    for _ in range(50):
        if not any(_alive(pid) for pid in workers):
            break
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)
    assert _shm() - before == set()


def test_a_worker_that_cannot_open_its_source_says_why(tmp_path: Path) -> None:
    from edgert.io.capture.process import ProcessCaptureSource

    with pytest.raises(SourceError, match="video file not found"):
        ProcessCaptureSource(SourceConfig(uri=str(tmp_path / "missing.mp4"))).open()


def test_auto_capture_takes_processes_for_many_sources_on_enough_cores() -> None:
    assert choose_capture("auto", 1, cpus=16) == "thread"
    assert choose_capture("auto", 4, cpus=16) == "process"
    assert choose_capture("auto", 16, cpus=2) == "thread"  # two cores: a process per source only adds switches
    assert choose_capture("thread", 32, cpus=16) == "thread"
    assert choose_capture("auto", 8, cpus=16, preload=True) == "thread"
    with pytest.raises(ConfigError, match="preloaded"):
        choose_capture("process", 4, preload=True)
    with pytest.raises(ConfigError, match="not one of"):
        choose_capture("fork", 4)


def test_the_jetson_file_pipeline_decodes_on_the_hardware_decoder() -> None:
    text = jetson_file_pipeline("/data/cam 1.mp4")
    assert text.startswith('filesrc location="/data/cam 1.mp4" ! ')
    assert "nvv4l2decoder" in text and "nvvidconv" in text
    assert text.endswith("appsink sync=false max-buffers=4 drop=false")  # a file: every frame, never dropped


def test_the_capture_key_is_read_from_yaml_and_a_bad_value_names_it(tmp_path: Path) -> None:
    from edgert.config import load_config

    good = tmp_path / "good.yaml"
    good.write_text("source:\n  uri: a.mp4\n  capture: process\n")
    assert load_config(good).source.capture == "process"
    bad = tmp_path / "bad.yaml"
    bad.write_text("source:\n  uri: a.mp4\n  capture: fork\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: source.capture: expected one of auto, thread, process"):
        load_config(bad)


def test_a_folder_of_images_of_several_sizes_comes_through_the_worker_unchanged(tmp_path: Path) -> None:
    """Smaller frames reuse their slot, a larger one than the first travels through the pipe: same pixels."""
    import cv2

    from edgert.io.capture.process import ProcessCaptureSource
    from edgert.io.sources import open_source

    rng = np.random.default_rng(2)
    for i, (w, h) in enumerate(((64, 48), (32, 40), (96, 80), (64, 48))):
        cv2.imwrite(str(tmp_path / f"{i}.png"), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    theirs = _frames(ProcessCaptureSource(SourceConfig(uri=str(tmp_path))))
    ours = _frames(open_source(str(tmp_path)))
    assert len(ours) == 4 and theirs == ours


def test_process_capture_of_a_preloaded_source_is_refused_in_one_line(media: dict[str, Any]) -> None:
    proc = _cli("--model", str(media["model"]), "--source", str(media["videos"][0]), "--preload",
                "--capture", "process")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot apply to a preloaded source" in lines[0], proc.stderr


def _collected(source: Any, hold: int, kill_at: int | None = None) -> tuple[list[str], list[int], str | SourceError]:
    """Every frame of ``source`` the way the collector reads it (poll, pull, take, give_back), holding at most
    ``hold`` frames at a time (its worker killed at the ``kill_at``-th frame); the frames' digests, their slots,
    and how it ended."""
    import select

    digests: list[str] = []
    slots: list[int] = []
    with source:
        source.attach(hold)
        poller = select.poll()
        poller.register(source.fileno(), select.POLLIN)
        held: list[int] = []
        for _ in range(10_000):
            if source.wants_pull and poller.poll(5000):
                source.pull()
            taken, outcome = source.take(hold - len(held))
            for pixels, slot, _current in taken:
                if len(digests) == kill_at:
                    os.kill(source.worker_pid, signal.SIGKILL)
                digests.append(hashlib.sha1(np.ascontiguousarray(pixels).tobytes()).hexdigest())
                slots.append(slot)
                if slot >= 0:
                    held.append(slot)
            source.give_back(held[:1])  # one back per round: the worker waits for slots now and then
            del held[:1]
            if outcome is not None:
                return digests, slots, outcome
    raise AssertionError("the source did not end")


def test_the_collectors_reads_give_every_frame_whole_also_one_larger_than_a_read(tmp_path: Path) -> None:
    """pull/take (the collector's): the pipe's messages framed as the worker's Connection writes them, a frame
    sent through the pipe (larger than its slot, and than one read of the pipe) whole, in order, same pixels."""
    import cv2

    from edgert.io.capture.process import _PULL_BYTES, ProcessCaptureSource
    from edgert.io.sources import open_source

    rng = np.random.default_rng(3)
    sizes = ((64, 48), (32, 40), (1024, 768), (64, 48), (48, 32), (1280, 720), (64, 48))
    assert _PULL_BYTES < 1280 * 720 * 3  # the large ones take several reads
    for i, (w, h) in enumerate(sizes):
        cv2.imwrite(str(tmp_path / f"{i}.png"), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    ours = _frames(open_source(str(tmp_path)))
    digests, slots, outcome = _collected(ProcessCaptureSource(SourceConfig(uri=str(tmp_path))), hold=2)
    assert outcome == "end" and digests == ours and len(ours) == len(sizes)
    assert slots[2] == slots[5] == -1 and min(slots[:2] + slots[3:5] + slots[6:]) >= 0


def test_a_killed_worker_ends_the_collectors_reads_after_the_frames_it_sent(media: dict[str, Any]) -> None:
    """A worker killed mid-file: the frames it had sent are taken, then its end of the pipe is the source's
    error, saying how the worker ended."""
    from edgert.io.capture.process import ProcessCaptureSource

    source = ProcessCaptureSource(SourceConfig(uri=str(media["long"][0])))
    digests, _, outcome = _collected(source, hold=3, kill_at=30)
    assert isinstance(outcome, SourceError) and "killed by SIGKILL" in str(outcome)
    assert 30 <= len(digests) < 400
