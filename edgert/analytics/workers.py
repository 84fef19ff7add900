"""Tracking, lines and zones of groups of sources in worker processes (``track.workers``), off the results thread.

Why processes: ByteTrack costs about 1.15 ms of CPU per frame (docs/tracking.md), all of it Python and small NumPy
calls that hold the interpreter lock, so on the results thread it is serialised with the slot threads that feed
the engine: NanoDet at 16 streams on the H200 ran 3 013 frames/s without tracking and 867 with it (docs/pipeline.md).
A thread per group would hold the same lock; a process per group does not.

Each source is always in the same worker (source ``i`` in worker ``i % workers``), which makes its stages on its
first frame from the same config, frame rate, frame size and class names as the in-process path, and steps them in
the source's order: the same track ids and counts. The results thread sends, per batch and per worker, one message
of small arrays (every frame's boxes, scores and classes concatenated) and gets back one (the tracked boxes and the
events per frame), so its own cost is a bounded number of calls per batch. A worker that dies is the run's error in
one line; workers ignore SIGINT and SIGTERM (the parent stops them) and leave when their pipe closes, so a parent
killed outright leaves none behind.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from edgert.errors import Aborted, ConfigError, EdgertError, process_ended
from edgert.vision.detections import Detections

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from edgert.analytics.stages import ResultStage
    from edgert.config import PipelineConfig

__all__ = ["AUTO_MIN_SOURCES", "RemoteStages", "StagedFrame", "TrackingWorkers", "tracking_worker_count"]

log = logging.getLogger(__name__)

#: ``track.workers`` unset: workers from this many sources, when the machine has at least ``_AUTO_MIN_CPUS`` cores
AUTO_MIN_SOURCES = 8
_AUTO_MIN_CPUS = 4
_SOURCES_PER_WORKER = 4  # 4 x 1.15 ms per batch and worker: under the 5 ms NanoDet's batch of 16 takes on the H200
_START_TIMEOUT_S = 60.0  # spawning and importing NumPy, SciPy and edgert on a slow Jetson core
_CLOSE_TIMEOUT_S = 5.0
_POLL_S = 0.1
_SUMMARY_EVERY = 10  # a source's tracking and counts come back every 10th frame (what the metrics read), and at the end


def tracking_worker_count(config: PipelineConfig, sources: int, cpus: int | None = None) -> int:
    """How many worker processes track for ``sources`` sources: ``track.workers`` when set (0: none, in-process),
    else one per 4 sources from 8 sources on where the machine has 4 cores or more, at most a quarter of them."""
    track = config.track
    if track is None or sources < 1:
        return 0
    if track.workers is not None:
        if track.workers > sources:
            raise ConfigError(f"track.workers: {track.workers} worker processes for {sources} source(s). "
                              f"Note: expected 0..{sources} (each source is tracked by one worker)")
        return int(track.workers)
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    if sources < AUTO_MIN_SOURCES or cpus < _AUTO_MIN_CPUS:
        return 0
    return max(1, min(math.ceil(sources / _SOURCES_PER_WORKER), cpus // 4))



class StagedFrame(Protocol):
    """What :meth:`TrackingWorkers.apply` reads of a frame (the pipeline's frames have it): which source, which
    frame of it, its time on the source's clock, what its slot found. A protocol, so analytics knows nothing of
    the pipeline above it."""

    feed: int
    index: int
    media_time: float
    detections: Detections | None

class RemoteStages:
    """What a source's ``stages`` are when a worker runs them: the summary the worker last reported (the run's
    figures, the metrics and the drawing read it) and the analytics config the drawing needs; never run here."""

    name = "remote"

    def __init__(self, local: Sequence[ResultStage]) -> None:
        from edgert.analytics.stages import stages_summary

        self.analytics = getattr(local[-1], "analytics", None) if local else None
        self.last: dict[str, Any] = stages_summary(local)

    def process(self, detections: Detections, frame_index: int,
                timestamp: float) -> tuple[Detections, list[dict[str, Any]]]:
        raise RuntimeError("a source tracked by a worker process has its frames sent there (TrackingWorkers.apply)")

    def summary(self) -> dict[str, Any]:
        return self.last


class TrackingWorkers:
    """``count`` worker processes, each running the result stages of the sources ``i % count`` gives it."""

    def __init__(self, config: PipelineConfig, names: Sequence[str], count: int, sources: int) -> None:
        """``count`` workers for a run of ``sources`` sources (with several, each event names its source)."""
        ctx = multiprocessing.get_context("spawn")  # never fork: the parent holds CUDA contexts and threads
        self.count = count
        self.names = tuple(names)
        self.sources = sources
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._specs: dict[int, tuple[str, float | None, tuple[int, int]]] = {}  # feed -> name, fps, size
        self._sent: set[int] = set()  # feeds whose spec a worker has
        self._remote: dict[int, RemoteStages] = {}
        self._closed = False
        for k in range(count):
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_serve, args=(child, config, tuple(names)), daemon=True,
                               name=f"edgert-track{k}")
            proc.start()
            child.close()  # the worker's end lives only in the worker: its death is EOF here
            self._conns.append(parent)
            self._procs.append(proc)
        for k in range(count):
            self._reply(k, _START_TIMEOUT_S, None)  # ("ready",): imports done, before the first frame waits on it

    def pids(self) -> list[int]:
        return [int(p.pid) for p in self._procs]

    def adopt(self, index: int, name: str, fps: float | None, size: tuple[int, int],
              local: Sequence[ResultStage]) -> list[ResultStage]:
        """Hand source ``index``'s stages (made and checked in this process, on its frame ``size``) to its worker:
        the source's new stages."""
        self._specs[index] = (name, fps, size)
        remote = self._remote[index] = RemoteStages(local)
        return [remote]

    def tracks(self, index: int) -> bool:
        return index in self._remote

    def apply(self, frames: Sequence[StagedFrame], aborting: threading.Event | None = None,
              ) -> list[tuple[Detections, list[dict[str, object]]]]:
        """Every frame's detections and events after its source's stages, in ``frames``' order: one message to
        each worker that has some of them, then one reply from each; ``aborting`` ends a wait for a reply."""
        groups: dict[int, list[int]] = {}
        for i, f in enumerate(frames):
            groups.setdefault(f.feed % self.count, []).append(i)
        for k, idx in groups.items():
            meta: list[tuple[int, int, float, int, Any]] = []
            dets = []
            for i in idx:
                f = frames[i]
                d = f.detections
                if d is None:
                    raise RuntimeError(f"frame {f.index} of source {f.feed} came back from its slot without detections")
                spec = None if f.feed in self._sent else self._specs[f.feed]
                self._sent.add(f.feed)
                meta.append((f.feed, f.index, f.media_time, len(d), spec))
                dets.append(d)
            try:
                self._conns[k].send(("batch", meta, *_pack(dets)))
            except OSError:  # BrokenPipeError would read as "stdout closed" to the CLI: name the worker instead
                self._procs[k].join(1.0)
                raise EdgertError(self._died(k)) from None
        out: list[Any] = [None] * len(frames)
        names = self.names
        for k, idx in groups.items():
            msg = self._reply(k, None, aborting)
            _, counts, xyxy, conf, cls, tid, events, summaries = msg
            ends = np.cumsum(counts)
            starts = ends - np.asarray(counts, np.int64)
            for j, i in enumerate(idx):
                a, b = int(starts[j]), int(ends[j])
                tracked = Detections(xyxy[a:b], conf[a:b], cls[a:b], names, tid[a:b])
                if self.sources > 1:
                    for event in events[j]:
                        event["source"] = self._specs[frames[i].feed][0]
                out[i] = (tracked, events[j])
            for feed_index, summary in summaries.items():
                self._remote[feed_index].last = summary
        return out

    def _reply(self, k: int, timeout: float | None, aborting: threading.Event | None) -> tuple[Any, ...]:
        conn, proc = self._conns[k], self._procs[k]
        waited = 0.0
        while not conn.poll(_POLL_S):
            waited += _POLL_S
            if aborting is not None and aborting.is_set():
                raise Aborted()
            if not proc.is_alive() and not conn.poll(0):
                raise EdgertError(self._died(k))
            if timeout is not None and waited > timeout:
                raise EdgertError(f"tracking worker {k} did not start in {timeout:.0f} s")
        try:
            msg: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError):
            proc.join(1.0)
            raise EdgertError(self._died(k)) from None
        if msg[0] == "error":
            raise EdgertError(f"tracking worker {k}: {msg[1]}")
        return msg

    def _died(self, k: int) -> str:
        return f"tracking worker {k} (sources {self._group(k)}) {_died(self._procs[k].exitcode)}"

    def _group(self, k: int) -> str:
        return ", ".join(self._specs[i][0] for i in sorted(self._specs) if i % self.count == k) or "none yet"

    def close(self) -> None:
        """The final tracking and counts of every source (for the run's summary), then every worker stopped;
        what a worker still had queued (an aborted batch) is skipped. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + _CLOSE_TIMEOUT_S
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):  # that worker is gone already
                conn.send(("end",))
        for k, (conn, proc) in enumerate(zip(self._conns, self._procs)):
            # A worker gone before its final summary: the last one it sent stands.
            with contextlib.suppress(EOFError, OSError):
                while conn.poll(max(0.0, deadline - time.monotonic())):
                    msg = conn.recv()
                    if msg[0] == "summary":
                        for feed_index, summary in msg[1].items():
                            self._remote[feed_index].last = summary
                        break
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("tracking worker %d did not stop in %.0f s: terminating it", k, _CLOSE_TIMEOUT_S)
                proc.terminate()
                proc.join(1.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(1.0)
            conn.close()


def _died(exitcode: int | None) -> str:
    return process_ended(exitcode) if exitcode is None else f"died: {process_ended(exitcode)}"


def _pack(dets: Sequence[Detections]) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    if not dets:
        return [], np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32)
    return ([len(d) for d in dets], np.concatenate([d.xyxy for d in dets]),
            np.concatenate([d.confidence for d in dets]), np.concatenate([d.class_id for d in dets]))


def _serve(conn: Connection, config: PipelineConfig, names: tuple[str, ...]) -> None:
    """A worker: its sources' stages, made on their first frame; frames in, tracked boxes and events out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the run and then this worker
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from edgert.analytics.assignment import load_solver
    from edgert.analytics.stages import make_result_stages, run_stages, stages_summary

    load_solver()  # the stages are made on a source's first frame: the solver's import goes before it, here
    stages: dict[int, list[ResultStage]] = {}
    seen: dict[int, int] = {}
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if msg[0] == "end":
            conn.send(("summary", {i: stages_summary(s) for i, s in stages.items()}))
            return
        try:
            _, meta, counts, xyxy, conf, cls = msg
            out: list[Detections] = []
            events: list[list[dict[str, Any]]] = []
            summaries: dict[int, dict[str, Any]] = {}
            start = 0
            for (feed, index, media_time, n, spec), _ in zip(meta, counts):
                if spec is not None:
                    name, fps, size = spec
                    stages[feed] = make_result_stages(config, fps, size, names, name)
                d = Detections(xyxy[start:start + n], conf[start:start + n], cls[start:start + n], names)
                start += n
                tracked, more = run_stages(stages[feed], d, index, media_time)
                out.append(tracked)
                events.append(more)
                seen[feed] = seen.get(feed, 0) + 1
                if seen[feed] % _SUMMARY_EVERY == 1:
                    summaries[feed] = stages_summary(stages[feed])
            ids = [d.track_id if d.track_id is not None else np.full(len(d), -1, np.int64) for d in out]
            conn.send(("ok", [len(d) for d in out], *_pack(out)[1:], np.concatenate(ids) if ids
                       else np.zeros(0, np.int64), events, summaries))
        except Exception as exc:  # one line to the parent, which makes it the run's error
            from edgert.errors import first_line

            conn.send(("error", f"{type(exc).__name__}: {first_line(exc)}"))
            return
