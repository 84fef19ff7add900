"""A progress indicator on stderr for engine builds, which take minutes on a Jetson.

TensorRT 10+ reports build phases through ``IProgressMonitor``; older versions report nothing, so a
ticking elapsed-time bar runs in any case and TensorRT's phases, when they come, become its label.
"""

from __future__ import annotations

import sys
import threading
import time
from types import ModuleType, TracebackType
from typing import Any

__all__ = ["BuildProgress"]


class BuildProgress:
    """``with BuildProgress("yolov8s.onnx", enabled) as p: config.progress_monitor = p.monitor(trt)``."""

    def __init__(self, label: str, enabled: bool | None = None, tick: float = 0.25) -> None:
        self.label = label
        # None: only when stderr is a terminal, so logs and CI output stay clean.
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.tick = tick
        self.phase = ""
        self._bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def __enter__(self) -> BuildProgress:
        self._t0 = time.monotonic()
        if self.enabled:
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

            def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
                self.steps[phase_name] = num_steps
                progress.phase = phase_name

            def step_complete(self, phase_name: str, step: int) -> bool:
                total = self.steps.get(phase_name, 0)
                progress.phase = f"{phase_name} {step + 1}/{total}" if total else phase_name
                return True  # False would cancel the build

            def phase_finish(self, phase_name: str) -> None:
                progress.phase = ""

        return Monitor()
