"""The doors of a model update on a running pipeline, and the steps from a dropped file to a swapped model.

``model.update_dir`` turns it on. One thread of the run (:class:`UpdateDoor`, an observer of the pipeline)
watches the folder and takes one candidate at a time through these states, each one journal line
(``model update: ...``), a history in the run summary's ``model_update`` and ``/metrics``
(``edgert_model_update_state``), and an event to its listeners (the MQTT door publishes them):

``queued`` -> ``building`` (N %) -> ``checking`` -> ``swapped`` | ``rejected``; later ``rolled back``.

- **queued**: a ``*.onnx`` file at the top of the folder whose size and time stayed the same for
  :data:`SETTLE_S` (a copy still being written is not taken; files whose name starts with ``.`` or ends in
  ``.partial`` are never taken: write there, then rename). ``NAME.onnx.json`` beside it (written first) holds its
  settings: ``{"precision": "int8", "images": DIR, "reference": FP32.onnx}``. The file moves to ``models/``.
- **building** / **checking**: ``python -m edgert.calib.update_gate`` in a child process at low priority, on the
  frames the run holds (:meth:`~edgert.pipeline.model_update.UpdatableProcessor.held_sample`), while the
  current model keeps running.
- **swapped**: the candidate's processor is opened and warmed on this thread, beside the running one, then
  swapped in between two batches (:mod:`edgert.pipeline.model_update`); the state file records it
  (:mod:`edgert.pipeline.update_state`).
- **rejected**: the gate said why; the file moves to ``rejected/`` with ``NAME.why.txt``; the run goes on.
- **rolled back**: during ``model.update_probation_s`` after a swap, a batch that fails on the new model (it is
  re-run on the previous one, reopened) or batches slower than ``model.update_max_slowdown`` times the
  previous model's; ``edgert update --rollback`` at any time (a ``rollback`` file in the folder).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgert.pipeline.model_update import UpdatableProcessor
from edgert.pipeline.observer import BaseObserver
from edgert.pipeline.update_state import record_swap, settle
from edgert.redact import redact

if TYPE_CHECKING:
    from edgert.pipeline.parts import JSONDict
    from edgert.pipeline.processor import Processor
    from edgert.pipeline.state import RunState

__all__ = ["SETTLE_S", "STATES", "UpdateDoor", "available_memory", "memory_refusal", "open_updates"]

log = logging.getLogger(__name__)

#: every state a candidate goes through, in the order they can come
STATES = ("queued", "building", "checking", "swapped", "rejected", "rolled back")
#: a dropped file is taken once its size and time stayed the same this long
SETTLE_S = 1.0
_POLL_S = 0.25
#: batches on a new model before its speed is judged against the previous model's
_SLOWDOWN_BATCHES = 20


#: what a candidate costs in memory, per byte of its model file and per session holding it (weights, their
#: optimised copy, the runtime's arena): a rough upper bound, which is what a refusal needs
_BYTES_PER_MODEL_BYTE = 3


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (on a Jetson the GPU's memory too: it is the same DRAM),
    or None where there is none."""
    from edgert.platform import sysroot

    try:
        text = (sysroot() / "proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def memory_refusal(model_bytes: int, sessions: int, available: int | None) -> str | None:
    """Why a candidate of ``model_bytes`` opened in ``sessions`` sessions (the run's slots and the gate's) does
    not fit beside the running model in ``available`` bytes, or None: a build must never push the running
    model's memory out (an 8 GB board swaps, or the OOM killer takes the service)."""
    need = _BYTES_PER_MODEL_BYTE * model_bytes * sessions
    if available is None or need <= available:
        return None
    return (f"it needs about {need / 2**20:.0f} MiB beside the running model ({sessions} sessions of a "
            f"{model_bytes / 2**20:.0f} MiB model) and {available / 2**20:.0f} MiB are available")


def open_updates(run: RunState, processor: Processor, owned: bool) -> UpdatableProcessor:
    """The run's processor behind the swap door, and the door that watches ``model.update_dir`` (an observer of
    the run: it starts with the first frame and stops with the run)."""
    from edgert.speech.stages import SPEECH_TASKS

    if run.config.task in SPEECH_TASKS:
        from edgert.errors import ConfigError

        raise ConfigError(f"model.update_dir: model updates are for detection tasks, not {run.config.task}")
    cfg = run.config.model
    wrapper = UpdatableProcessor(processor, owned=owned, label=Path(cfg.path).name, sample=cfg.update_sample)
    door = UpdateDoor(run, wrapper)
    run.observers.append(door)
    if cfg.update_mqtt:
        from edgert.pipeline.update_mqtt import attach_mqtt

        attach_mqtt(run, door)
    return wrapper


@dataclasses.dataclass
class Candidate:
    path: Path  # where it lies now (models/ once taken)
    label: str  # the file name it came with
    settings: dict[str, Any]
    via: str = "folder"


class UpdateDoor(BaseObserver):
    """Watches ``model.update_dir``, builds and checks candidates in a child process, swaps, rolls back."""

    def __init__(self, run: RunState, processor: UpdatableProcessor) -> None:
        self.run = run
        self.processor = processor
        self.config = run.config
        self.dir = Path(str(run.config.model.update_dir))
        self.model_path = run.config.model.path
        self.model_label = Path(self.model_path).name
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self.closers: list[Callable[[], None]] = []  # what the other doors close when the run stops (MQTT)
        self.queue: collections.deque[Candidate] = collections.deque()
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=32)
        self.counts: dict[str, int] = dict.fromkeys(STATES, 0)
        self.state = "idle"
        self._seen: dict[str, tuple[int, int, float]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._child: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._probation: dict[str, Any] | None = None
        self._retire: int | None = None  # a generation that failed and was rolled back, to close
        processor.on_failure = self._failed
        processor.before_close = self.halt
        try:
            for sub in ("models", "rejected"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from edgert.errors import ConfigError

            raise ConfigError(f"model.update_dir {self.dir}: cannot make its folders ({exc.strerror or exc}). "
                              "Note: a service may write only the folders of its config") from None
        self._publish()

    # -- the observer's side ----------------------------------------------------------------------------
    def on_start(self, info: JSONDict) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="edgert-model-update", daemon=True)
            self._thread.start()

    def on_stop_requested(self, reason: str) -> None:
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()

    def halt(self) -> None:
        """Stop the door's thread (and a build under way) and wait for it: before the run closes its processor,
        so no candidate opens or swaps into a closed run."""
        self.on_stop_requested("stopped")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)

    def on_stop(self, summary: JSONDict) -> None:
        self.halt()
        if self._probation is not None and not summary.get("error"):
            settle(self.dir)  # a clean stop: the new model lived; a restart is no crash loop
            self._probation = None
        summary["model_update"] = self.summary()
        for close in self.closers:
            close()

    # -- what the doors call ----------------------------------------------------------------------------
    def submit(self, path: Path, settings: dict[str, Any], via: str) -> None:
        """A candidate from another door (MQTT): copied into ``models/`` and queued."""
        taken = self._take(path, settings, copy=True)
        taken.via = via
        with self._lock:
            self.queue.append(taken)
        self._step("queued", taken.label, via=via)

    def summary(self) -> dict[str, Any]:
        return {"state": self.state, "model": self.model_label, "generation": self.processor.generation,
                "counts": {k: v for k, v in self.counts.items() if v}, "history": list(self.history)}

    # -- the thread -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._rollback_requested()
                if self._retire is not None and self.processor.retire(self._retire, self.run.stopping):
                    self._retire = None
                self._watch_probation()
                self._scan()
                with self._lock:
                    candidate = self.queue.popleft() if self.queue else None
                if candidate is not None:
                    self._handle(candidate)
            except Exception as exc:  # the door must never take the run down
                log.error("model update: %s", redact(str(exc)), exc_info=log.isEnabledFor(logging.DEBUG))
            self._stop.wait(_POLL_S)

    def _scan(self) -> None:
        now = time.monotonic()
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            return
        present = set()
        for e in entries:
            name = e.name
            if name.startswith(".") or not name.endswith(".onnx") or not e.is_file(follow_symlinks=False):
                continue
            present.add(name)
            st = e.stat(follow_symlinks=False)
            key = (st.st_size, st.st_mtime_ns)
            seen = self._seen.get(name)
            if seen is None or seen[:2] != key:
                self._seen[name] = (*key, now)
                continue
            if now - seen[2] < SETTLE_S:
                continue
            del self._seen[name]
            present.discard(name)
            path = self.dir / name
            candidate = self._take(path, self._settings(path), copy=False)
            with self._lock:
                self.queue.append(candidate)
            self._step("queued", candidate.label, via="folder")
        for name in list(self._seen):
            if name not in present:
                del self._seen[name]

    @staticmethod
    def _settings(path: Path) -> dict[str, Any]:
        side = Path(f"{path}.json")
        if not side.is_file():
            return {}
        try:
            data = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"error": f"{side.name} is not JSON"}
        finally:
            side.unlink(missing_ok=True)
        return data if isinstance(data, dict) else {"error": f"{side.name} is not a JSON object"}

    def _take(self, path: Path, settings: dict[str, Any], copy: bool) -> Candidate:
        """The candidate moves (or is copied) to ``models/`` under a name no later drop can take."""
        target = self.dir / "models" / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{len(self.history)}-{path.name}"
        if copy:
            shutil.copyfile(path, target)
        else:
            os.replace(path, target)
        return Candidate(target, path.name, settings)

    def _handle(self, c: Candidate) -> None:
        if c.settings.get("error"):
            self._reject(c, str(c.settings["error"]))
            return
        why = memory_refusal(c.path.stat().st_size, len(self.processor.slots) + 1, available_memory())
        if why is not None:
            self._reject(c, why)
            return
        held = self.processor.held_sample()
        while not held and not self._stop.wait(0.2):  # the first frames are not held yet
            held = self.processor.held_sample()
        if self._stop.is_set():
            return
        self.state = "queued"  # a new candidate: its building is a state of its own, not the last one's progress
        self._step("building", c.label, progress=0)
        result = self._gate(c, held)
        if self._stop.is_set():  # the run stops mid-build: the candidate waits in the folder for the next start
            self._put_back(c)
            return
        if not result.get("ok"):
            self._reject(c, str(result.get("why") or "the check failed"), result)
            return
        try:
            processor = self._open(str(result.get("built") or c.path))
        except Exception as exc:
            from edgert.errors import first_line

            self._reject(c, f"it does not open beside the running model: {first_line(exc)}", result)
            return
        if self._stop.is_set():  # the run ended while it opened: nothing to swap into
            processor.close()
            self._put_back(c)
            return
        self._swap(processor, str(result.get("built") or c.path), c.label, result)

    def _gate(self, c: Candidate, held: list[Any]) -> dict[str, Any]:
        """The child process's build and check of ``c`` on the ``held`` frames; its result."""
        work = Path(tempfile.mkdtemp(prefix="edgert-update-"))
        try:
            frames = work / "frames.npz"
            np.savez(frames, **{f"f_{i}": h.pixels for i, h in enumerate(held)})
            cfg = self.config
            job = {"candidate": str(c.path), "reference": c.settings.get("reference"), "out": str(c.path.parent),
                   "precision": c.settings.get("precision", "fp32"), "images": c.settings.get("images"),
                   "frames": str(frames), "counts": [h.counts for h in held],
                   "min_map": cfg.model.update_min_map, "max_count_ratio": cfg.model.update_max_count_ratio,
                   "config": {"preprocess": dataclasses.asdict(cfg.preprocess),
                              "decode": dataclasses.asdict(cfg.decode)}, **self._engine_job()}
            (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
            with (work / "stderr.txt").open("w+", encoding="utf-8") as errors:
                result = self._follow(c, work / "job.json", errors)
            return result
        finally:
            self._child = None
            shutil.rmtree(work, ignore_errors=True)

    def _engine_job(self) -> dict[str, Any]:
        """What the child needs to build an engine (a TensorRT run: engines are never built while serving)."""
        from edgert.backends import builds_engines

        backend = self.config.model.backend if self.config.model.backend != "auto" else self.processor.backend_name
        if not builds_engines(backend):
            return {}
        return {"builds_engines": True, "backend": backend, "engine_precision": self.config.model.precision,
                "batch": self.processor.batch}

    def _follow(self, c: Candidate, job: Path, errors: Any) -> dict[str, Any]:
        """Start the child on ``job`` and follow its progress lines to its result."""
        child = self._child = subprocess.Popen([sys.executable, "-m", "edgert.calib.update_gate", str(job)],
                                               stdout=subprocess.PIPE, stderr=errors, text=True)
        result: dict[str, Any] | None = None
        for line in child.stdout or ():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "result" in msg:
                result = msg["result"]
            elif "warning" in msg:
                log.warning("model update: %s: %s", c.label, msg["warning"])
            elif msg.get("step") == "checking":
                self._step("checking", c.label, progress=int(msg.get("progress", 0)))
            else:
                self._step("building", c.label, progress=int(msg.get("progress", 0)))
        code = child.wait()
        if result is None:  # it died: its last line of stderr says why
            errors.seek(0)
            last = " ".join([line for line in errors.read().splitlines() if line.strip()][-1:])
            result = {"ok": False, "why": f"the build process ended (exit {code}) without a result: {last[:300]}"}
        return result

    def _open(self, path: str) -> Processor:
        """The candidate's processor, as the run's: same processing, slots and batch; warmed."""
        from edgert.pipeline.choice import open_processor

        cfg = self.config
        runtime = dataclasses.replace(cfg.runtime, slots=len(self.processor.slots))
        config = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=path), runtime=runtime)
        processor = open_processor(config, batch=self.processor.batch, sources=len(self.run.feeds))
        try:
            processor.warm_up(cfg.runtime.warmup)
        except BaseException:
            processor.close()
            raise
        return processor

    def _swap(self, processor: Processor, path: str, label: str, result: dict[str, Any]) -> None:
        previous = (self.model_path, self.model_label)
        baseline = self.processor.mean_batch_ms(self.processor.generation)
        gen = self.processor.swap_in(processor, label, self.run.stopping)
        self.run.names = self.processor.names
        self.model_path, self.model_label = path, label
        record_swap(self.dir, path, label, *previous)
        self._probation = {"generation": gen, "until": time.monotonic() + self.config.model.update_probation_s,
                           "previous": previous, "baseline_ms": baseline}
        self._step("swapped", label, generation=gen, map50_95=result.get("map50_95"),
                   detections=result.get("detections"), classes=len(self.processor.names))

    def _put_back(self, c: Candidate) -> None:
        target = self.dir / c.label
        if c.via != "folder" or target.exists():
            return
        try:
            if c.settings:
                Path(f"{target}.json").write_text(json.dumps(c.settings), encoding="utf-8")
            os.replace(c.path, target)
        except OSError as exc:
            log.warning("model update: %s stays in models/ (%s)", c.label, exc)

    def _reject(self, c: Candidate, why: str, result: dict[str, Any] | None = None) -> None:
        target = self.dir / "rejected" / c.label
        try:
            os.replace(c.path, target)
            Path(f"{target}.why.txt").write_text(why + "\n", encoding="utf-8")
        except OSError as exc:  # the refusal stands (it is the journal's and the summary's); the file stays put
            log.warning("model update: %s not moved to rejected/ (%s)", c.label, exc)
        self._step("rejected", c.label, why=why, **({"map50_95": result.get("map50_95")} if result else {}))

    # -- rollback -----------------------------------------------------------------------------------
    def _watch_probation(self) -> None:
        p = self._probation
        if p is None:
            return
        gen = p["generation"]
        if self.processor.generation != gen:  # a failed batch already rolled it back (on a slot's thread)
            return
        base = p["baseline_ms"]
        now_ms = self.processor.mean_batch_ms(gen)
        slow = self.config.model.update_max_slowdown
        if base and now_ms and self.processor.batches_on(gen) >= _SLOWDOWN_BATCHES and now_ms > slow * base:
            self._roll_back(f"{now_ms:.1f} ms a batch against {base:.1f} ms before (bound {slow:g}x)")
        elif time.monotonic() > p["until"]:
            settle(self.dir)
            self._probation = None
            log.info("model update: %s kept (probation over)", self.model_label)

    def _roll_back(self, why: str, reopen: bool = True) -> Processor | None:
        p = self._probation
        if p is None:
            return None
        path, label = str(p["previous"][0]), str(p["previous"][1])
        processor = self._open(path)
        if reopen:
            self.processor.swap_in(processor, label, self.run.stopping)
        self._rolled_back(path, label, why)
        return processor

    def _rolled_back(self, path: str, label: str, why: str, record: bool = True) -> None:
        self._probation = None
        self.run.names = self.processor.names
        bad = self.model_label
        self.model_path, self.model_label = path, label
        if record:  # (edgert update --rollback wrote the state file itself)
            settle(self.dir, (path, label))
        self._step("rolled back", label, why=f"{bad}: {why}")

    def _failed(self, exc: BaseException) -> Processor | None:
        """A batch failed on the new model (a slot's thread): reopen the previous one to take it, in probation."""
        from edgert.errors import first_line

        if self._probation is None or self._stop.is_set():
            return None
        self._retire = self._probation["generation"]  # the door thread closes it once its batches are through
        try:
            return self._roll_back(f"{type(exc).__name__}: {first_line(exc)}", reopen=False)
        except Exception as reopen:
            log.error("model update: the previous model did not reopen: %s", first_line(reopen))
            return None

    def _rollback_requested(self) -> None:
        """``edgert update --rollback`` wrote ``rollback`` (the model to go back to; the state file says it too)."""
        request = self.dir / "rollback"
        if not request.exists():
            return
        try:
            target = json.loads(request.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            target = {}
        finally:
            request.unlink(missing_ok=True)
        path = str(target.get("path", "")) if isinstance(target, dict) else ""
        if not path or path == self.model_path or not os.path.isfile(path):
            return
        label = str(target.get("label") or Path(path).name)
        self._probation = None
        self.processor.swap_in(self._open(path), label, self.run.stopping)
        self._rolled_back(path, label, "edgert update --rollback", record=False)

    # -- telling -------------------------------------------------------------------------------------
    def _step(self, state: str, label: str, **facts: Any) -> None:
        """One state of one candidate: a journal line, the history, the live figures, the listeners."""
        facts = {k: v for k, v in facts.items() if v is not None}
        event = {"state": state, "model": label, "time": round(time.time(), 3), **facts}
        progress = state == self.state and state in ("building", "checking")  # the same state, further on
        self.state = state
        if not progress:  # the start of each state is one line; its progress only updates the figures
            self.counts[state] += 1
            self.history.append(event)
            detail = ", ".join(f"{k} {v}" for k, v in facts.items() if k != "progress")
            level = logging.WARNING if state in ("rejected", "rolled back") else logging.INFO
            log.log(level, "model update: %s %s%s", label, state, f" ({redact(detail)})" if detail else "")
        self._publish(event)
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception as exc:  # a listener (MQTT) must not stop the door
                log.warning("model update: a listener failed: %s", exc)

    def _publish(self, event: dict[str, Any] | None = None) -> None:
        self.run.stats.model_update = {"state": self.state, "model": self.model_label,
                                       "generation": self.processor.generation, "counts": dict(self.counts),
                                       "progress": (event or {}).get("progress")}
