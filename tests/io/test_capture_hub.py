"""The capture workers' shared pipe (edgert.io.capture.hub): records of several processes interleaved arrive
whole and in order per source, a writer killed mid-stream leaves no half record, and sources read through one
hub (as the collector reads them) give every frame in order, a frame sent through a worker's own pipe in its turn,
a killed worker its own source's failure after the frames it sent.

Real processes (subprocesses writing the hub, spawned capture workers), real videos and images.
"""

from __future__ import annotations

import hashlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.config import SourceConfig
from edgert.errors import SourceError
from edgert.io.capture.hub import HUB_RECORD_BYTES, HubWriter, MessageHub
from tests.pipeline.media import make_video

pytest.importorskip("cv2")

# A writer process: ``count`` records of tag ``tag``, each (tag, seq, payload) with a payload that says its seq,
# sized up to the largest record the hub takes, so that writes that were not atomic would cut into each other.
_WRITER = """
import os, sys
from edgert.io.capture.hub import HUB_RECORD_BYTES, HubWriter
fd, tag, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
hub = HubWriter(fd, tag)
seq = 0
while count < 0 or seq < count:
    size = (seq * 977) % (HUB_RECORD_BYTES - 100)
    assert hub.send((tag, seq, bytes([seq % 251]) * size))
    seq += 1
"""


def _writer(hub: MessageHub, tag: int, count: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(hub.writer), str(tag), str(count)],
                            pass_fds=(hub.writer,), cwd=Path(__file__).resolve().parents[2])


def _read_to_end(hub: MessageHub, slow: float = 0.0) -> list[int]:
    poller = select.poll()
    poller.register(hub.fileno(), select.POLLIN)
    touched: list[int] = []
    deadline = time.monotonic() + 120
    while not hub.ended and time.monotonic() < deadline:
        if poller.poll(1000):
            touched += hub.read()
            time.sleep(slow)  # the pipe fills meanwhile: the writers block on it, several at once
    assert hub.ended
    return touched


def _wait_until_full(hub: MessageHub) -> None:
    """Until the hub's pipe is full, as the kernel counts it (what it holds stops growing: its writers block)."""
    import fcntl
    import termios

    held, last, still = np.zeros(1, np.int32), -1, 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fcntl.ioctl(hub.fileno(), termios.FIONREAD, held)
        still = still + 1 if held[0] == last and held[0] >= 16384 else 0
        if still >= 4:
            return
        last = int(held[0])
        time.sleep(0.05)
    raise AssertionError(f"the hub never filled: {held[0]} bytes")


def _check(inbox: Any, tag: int) -> int:
    seqs = []
    for msg in inbox:
        t, seq, payload = msg
        assert t == tag
        assert payload == bytes([seq % 251]) * ((seq * 977) % (HUB_RECORD_BYTES - 100))  # whole, not cut
        seqs.append(seq)
    assert seqs == list(range(len(seqs)))  # in order, none lost or doubled
    return len(seqs)


def test_records_of_several_writer_processes_arrive_whole_and_in_order_per_source() -> None:
    import collections

    hub = MessageHub()
    inboxes = {tag: collections.deque() for tag in range(4)}  # type: ignore[var-annotated]
    for tag, inbox in inboxes.items():
        hub.route(tag, inbox)
    writers = [_writer(hub, tag, 400) for tag in inboxes]
    hub.close_writer()
    try:
        touched = _read_to_end(hub, slow=0.002)
    finally:
        for w in writers:
            w.wait(60)
        hub.close()
    assert [w.returncode for w in writers] == [0] * 4
    assert [_check(inboxes[tag], tag) for tag in inboxes] == [400] * 4
    assert sorted(set(touched)) == [0, 1, 2, 3] and len(touched) == 1600
    assert hub._partial == b""


def test_a_writer_killed_mid_stream_leaves_only_whole_records() -> None:
    import collections

    hub = MessageHub()
    inboxes = {tag: collections.deque() for tag in range(2)}  # type: ignore[var-annotated]
    for tag, inbox in inboxes.items():
        hub.route(tag, inbox)
    killed, other = _writer(hub, 0, -1), _writer(hub, 1, 300)  # the first writes until it is killed
    hub.close_writer()
    try:
        _wait_until_full(hub)  # both block on the full pipe: the first is killed in the middle of its writes
        killed.send_signal(signal.SIGKILL)
        touched = _read_to_end(hub)
    finally:
        killed.wait(60)
        other.wait(60)
        hub.close()
    assert killed.returncode == -signal.SIGKILL and other.returncode == 0
    assert _check(inboxes[0], 0) > 0 and _check(inboxes[1], 1) == 300
    assert hub._partial == b"" and len(touched) == len(inboxes[0]) + 300


def test_a_message_too_large_for_one_atomic_write_is_refused_by_the_writer() -> None:
    r, w = os.pipe()
    try:
        writer = HubWriter(w, 7)
        assert not writer.send(("frame", b"x" * HUB_RECORD_BYTES))
        assert writer.send(("frame", b"x" * 100))
        assert len(os.read(r, 1 << 16)) < HUB_RECORD_BYTES
    finally:
        os.close(r)
        os.close(w)


def _digests_in_process(uri: str) -> list[str]:
    from edgert.io.sources import open_source

    digests, out = [], None
    with open_source(uri) as source:
        while (frame := source.read(out)) is not None:
            digests.append(hashlib.sha1(np.ascontiguousarray(frame).tobytes()).hexdigest())
            out = frame
    return digests


def _collect(sources: list[Any], hold: int, kill: tuple[int, int] | None = None
             ) -> tuple[list[list[str]], list[list[int]], list[Any], list[int]]:
    """Every frame of ``sources`` the way the collector reads them: one poll for the own pipes and the hub, the
    own pipes read first, then the hub; at most ``hold`` frames of each held at a time, ``kill`` = (source, at):
    that source's worker killed at its ``at``-th frame. Each source's digests, slots, outcome; the hub's tags."""
    hub = MessageHub()
    digests: list[list[str]] = [[] for _ in sources]
    slots: list[list[int]] = [[] for _ in sources]
    outcomes: list[Any] = [None] * len(sources)
    held: list[list[int]] = [[] for _ in sources]
    tags: list[int] = []
    for s in sources:
        s.open()
        s.attach(hold)
    try:
        assert all(s.join_hub(hub, i) for i, s in enumerate(sources))
        hub.close_writer()
        poller = select.poll()
        by_fd = {s.fileno(): i for i, s in enumerate(sources)}
        for fd in (*by_fd, hub.fileno()):
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + 120
        while any(o is None for o in outcomes) and time.monotonic() < deadline:
            ready = poller.poll(5000)
            for fd, _ in ready:
                if fd in by_fd and sources[by_fd[fd]].wants_pull:
                    sources[by_fd[fd]].pull()
            if ready and not hub.ended:
                tags += hub.read()
            for i, s in enumerate(sources):
                if outcomes[i] is not None:
                    continue
                taken, outcomes[i] = s.take(hold - len(held[i]))
                for pixels, slot, _current in taken:
                    if kill is not None and kill[0] == i and len(digests[i]) == kill[1]:
                        os.kill(s.worker_pid, signal.SIGKILL)
                    digests[i].append(hashlib.sha1(np.ascontiguousarray(pixels).tobytes()).hexdigest())
                    slots[i].append(slot)
                    if slot >= 0:
                        held[i].append(slot)
                s.give_back(held[i][:1])  # one back per round: the worker waits for slots now and then
                del held[i][:1]
    finally:
        for s in sources:
            s.close()
        hub.close()
    return digests, slots, outcomes, tags


def test_sources_read_through_one_hub_give_every_frame_in_order_also_those_sent_through_their_pipes(
        tmp_path: Path) -> None:
    """A folder of mixed sizes (the larger frames through the worker's own pipe, between frames in slots that
    come through the hub) and a video, through one hub: each source's frames in order, the same pixels."""
    import cv2

    from edgert.io.capture.process import ProcessCaptureSource

    rng = np.random.default_rng(5)
    folder = tmp_path / "images"
    folder.mkdir()
    sizes = ((64, 48), (32, 40), (320, 240), (64, 48), (48, 32), (400, 300), (64, 48), (64, 48))
    for i, (w, h) in enumerate(sizes):
        cv2.imwrite(str(folder / f"{i}.png"), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    video = make_video(tmp_path / "v.avi", frames=60, size=(64, 48))
    sources = [ProcessCaptureSource(SourceConfig(uri=str(folder))), ProcessCaptureSource(SourceConfig(uri=str(video)))]
    digests, slots, outcomes, tags = _collect(sources, hold=2)
    assert outcomes == ["end", "end"]
    assert digests == [_digests_in_process(str(folder)), _digests_in_process(str(video))]
    assert slots[0][2] == slots[0][5] == -1 and min(slots[0][:2] + slots[0][3:5] + slots[0][6:]) >= 0
    assert tags.count(0) > 0 and tags.count(1) > 30  # the frames in slots came through the hub


def test_a_worker_killed_while_on_the_hub_ends_after_the_frames_it_sent_and_the_other_goes_on(
        tmp_path: Path) -> None:
    from edgert.io.capture.process import ProcessCaptureSource

    videos = [make_video(tmp_path / f"v{i}.avi", frames=200, size=(64, 48)) for i in range(2)]
    sources = [ProcessCaptureSource(SourceConfig(uri=str(v))) for v in videos]
    digests, _, outcomes, tags = _collect(sources, hold=3, kill=(0, 30))
    assert isinstance(outcomes[0], SourceError) and "killed by SIGKILL" in str(outcomes[0])
    assert 30 <= len(digests[0]) < 200 and digests[0] == _digests_in_process(str(videos[0]))[:len(digests[0])]
    assert outcomes[1] == "end" and digests[1] == _digests_in_process(str(videos[1]))
    assert tags.count(0) >= 25


def test_workers_that_sent_their_whole_file_before_the_hub_came_still_end_the_run(tmp_path: Path) -> None:
    """Files shorter than a ring: each worker has sent every frame and its end through its own pipe when the
    collector hands it the hub (the worker takes the descriptor in its last wait); every frame, in order."""
    from edgert.config import ModelConfig, PipelineConfig
    from edgert.io.capture.process import ProcessCaptureSource
    from edgert.pipeline import BaseObserver, Pipeline
    from tests.pipeline.media import tiny_detector

    videos = [make_video(tmp_path / f"v{i}.avi", frames=2, size=(64, 48)) for i in range(3)]
    sources = [ProcessCaptureSource(SourceConfig(uri=str(v))) for v in videos]
    config = PipelineConfig(model=ModelConfig(path=str(tiny_detector(tmp_path / "t.onnx"))))
    procs: list[Any] = []

    class _Workers(BaseObserver):
        def on_start(self, info: Any) -> None:
            procs.extend(s._proc for s in sources)  # the worker processes, to read how they ended

    summary = Pipeline(config, sources=sources, observers=[_Workers()], handle_signals=False).run()
    assert [(s["frames"], s["ended"]) for s in summary["sources"]] == [(2, "end of input")] * 3
    # Each took the hub's descriptor off its socket and read the stop whole: it exited by itself, not killed.
    assert len(procs) == 3 and [p.exitcode for p in procs] == [0, 0, 0]
