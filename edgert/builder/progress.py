"""A progress indicator on stderr for engine builds, which take minutes on a Jetson.

TensorRT 10+ reports build phases through ``IProgressMonitor``. Older versions (JetPack 5's 8.5, where a
detector's INT8 build takes many minutes) have none, so there the label follows the builder's verbose log
instead: the optimization profile being tuned and the layers timed so far. A ticking elapsed-time bar runs in
any case. Where stderr is no terminal (a service's journal, the model-update build), ``--progress`` writes
lines instead, one per tenth of the build: ``building yolov8s.onnx: 40 % (profile 2/4: ...; 95 s)``;
:func:`progress_percent` reads them back.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from types import ModuleType, TracebackType
from typing import Any

__all__ = ["BuildProgress", "progress_percent", "timing_runner"]

# TensorRT 8.x's verbose build log: the graph's layer count after each optimization pass (the last one before
# the profiles is what the builder times), each profile, each layer's timing runner ("--------------- Timing
# Runner: Conv_0 + Relu_1 (CaskConvolution)"; TensorRT-RTX adds " [profile 2]"), and the end of tuning
_LAYERS = re.compile(r"^After [\w\s-]+: (\d+) layers$")
_PROFILE = re.compile(r"Constructing optimization profile number \d+ \[(\d+)/(\d+)\]")
_RUNNER = re.compile(r"Timing Runner: (.+) \(([^()]*)\)$")
_PROFILE_TAG = re.compile(r"\s*\[profile \d+\]")
_DONE = "Engine generation completed"
_LINE = re.compile(r"^building .+: (\d{1,3}) % \(")


def timing_runner(message: str) -> tuple[str, str] | None:
    """(layer, tactic kind) of a "Timing Runner" message of TensorRT's verbose build log, the layer without
    TensorRT-RTX's profile tag; None for any other message."""
    m = _RUNNER.search(message)
    return (_PROFILE_TAG.sub("", m.group(1)).strip(), m.group(2)) if m else None


def progress_percent(line: str) -> int | None:
    """The percentage of one of :class:`BuildProgress`'s lines, or None for any other line."""
    m = _LINE.match(line)
    return int(m.group(1)) if m else None


class BuildProgress:
    """``with BuildProgress("yolov8s.onnx", enabled) as p: config.progress_monitor = p.monitor(trt)``."""

    def __init__(self, label: str, enabled: bool | None = None, tick: float = 0.25) -> None:
        self.label = label
        # None: only when stderr is a terminal, so logs and CI output stay clean.
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.lines = self.enabled and not sys.stderr.isatty()  # asked for (--progress) where no bar can redraw
        self.tick = tick
        self.phase = ""
        self.fraction: float | None = None  # of the whole build, where TensorRT's reports tell it
        self._said = -1  # the last tenth a line was written for
        self._bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._profile, self._layers = "", 0  # what the log has said (TensorRT < 10)
        self._timed: set[str] = set()
        self._place = (0, 1)  # profiles tuned before this one, profiles in all

    def __enter__(self) -> BuildProgress:
        self._t0 = time.monotonic()
        if self.enabled and not self.lines:
            from tqdm import tqdm

            self._bar = tqdm(total=None, desc=f"building {self.label}", bar_format="{desc} {elapsed} {postfix}",
                             file=sys.stderr, leave=False)
            self._thread = threading.Thread(target=self._run, name="edgert-build-progress", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            bar = self._bar
            if bar is not None:
                bar.set_postfix_str(self.phase, refresh=False)
                bar.refresh()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _moved(self, fraction: float | None) -> None:
        """A new fraction of the build: in lines mode, one line for each tenth reached."""
        if fraction is not None:
            self.fraction = max(self.fraction or 0.0, min(fraction, 1.0))
        if not self.lines or self.fraction is None or int(self.fraction * 10) <= self._said:
            return
        self._said = int(self.fraction * 10)
        print(f"building {self.label}: {int(self.fraction * 100)} % ({self.phase}; {self.elapsed:.0f} s)",
              file=sys.stderr, flush=True)

    def follow_log(self, trt: ModuleType, logger: Any) -> bool:
        """Where TensorRT has no progress monitor (< 10), label the bar from ``logger``'s messages (a logger made by
        :func:`edgert.engine.trt_logger.make_logger`, turned to verbose for the build). True when it does."""
        if not self.enabled or getattr(trt, "IProgressMonitor", None) is not None:
            return False
        logger.min_severity = trt.ILogger.Severity.VERBOSE
        logger.listener = self.from_log
        return True

    def from_log(self, message: str) -> None:
        """One message of TensorRT's build log: the label becomes ``profile i/n: k of N layers timed (name)``."""
        if m := _LAYERS.search(message):
            self._layers = int(m.group(1))
        elif m := _PROFILE.search(message):
            self._profile = f"profile {m.group(1)}/{m.group(2)}: "
            self._place = (int(m.group(1)) - 1, int(m.group(2)))
            self._timed.clear()
        elif runner := timing_runner(message):
            name = runner[0]
            if name.startswith("Optimizer Reformat"):  # a format conversion TensorRT times, not a network layer
                return
            self._timed.add(name)
            k = len(self._timed)
            of = f" of {self._layers}" if k <= self._layers else ""
            self.phase = f"{self._profile}{k}{of} layers timed ({name[:48]})"
            done, profiles = self._place
            # layers timed of the graph's count within this profile; the last one stays open until the end
            self._moved((done + min(k / self._layers, 0.99) if self._layers else done) / profiles)
        elif message.startswith(_DONE):
            self.phase = "writing the engine"
            self._moved(1.0)

    def monitor(self, trt: ModuleType) -> Any:
        """A ``trt.IProgressMonitor`` feeding this indicator, or None where TensorRT has none (< 10)."""
        base = getattr(trt, "IProgressMonitor", None)
        if base is None:
            return None
        progress = self

        class Monitor(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.steps: dict[str, int] = {}
                self.top = ""  # the outermost phase: its steps are the build's fraction

            def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
                self.steps[phase_name] = num_steps
                progress.phase = phase_name
                if parent_phase is None and not self.top:
                    self.top = phase_name

            def step_complete(self, phase_name: str, step: int) -> bool:
                total = self.steps.get(phase_name, 0)
                progress.phase = f"{phase_name} {step + 1}/{total}" if total else phase_name
                if phase_name == self.top and total:
                    progress._moved((step + 1) / total)
                return True  # False would cancel the build

            def phase_finish(self, phase_name: str) -> None:
                progress.phase = ""

        return Monitor()
