"""TensorRT's log, routed into Python logging under ``edgert.tensorrt``.

TensorRT's own WARNING level is mostly performance notes ("IShuffleLayer ... may cause excessive memory
consumption" dozens of times per YOLO build), so it maps to INFO (``-v`` shows it); errors stay errors.
Errors are also kept, so a failed parse or build can put TensorRT's own reason into one
:class:`~edgert.errors.BuildError` line. While :meth:`RoutedLogger.capturing` is active, errors are only
kept (logged at DEBUG): the caller reports them itself, once. A ``listener`` sees every message first (the
build progress of TensorRT versions without a progress monitor reads the builder's verbose log).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

__all__ = ["make_logger"]

log = logging.getLogger("edgert.tensorrt")

_MAX_KEPT = 32


def make_logger(trt: ModuleType) -> Any:
    """A ``trt.ILogger`` subclass instance for the given module (``tensorrt`` or ``tensorrt_rtx``)."""
    sev = trt.ILogger.Severity
    levels = {
        sev.INTERNAL_ERROR: logging.CRITICAL,
        sev.ERROR: logging.ERROR,
        sev.WARNING: logging.INFO,
        sev.INFO: logging.DEBUG,
        sev.VERBOSE: logging.DEBUG - 5,
    }
    errors = {sev.INTERNAL_ERROR, sev.ERROR}

    class RoutedLogger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            # TensorRT asks min_severity before formatting: skip VERBOSE unless debug logging is on.
            self.min_severity = sev.VERBOSE if log.isEnabledFor(logging.DEBUG - 5) else sev.INFO
            self.errors: list[str] = []
            self._capture = threading.local()
            self.listener: Callable[[str], None] | None = None  # every message, before its routing

        def log(self, severity: Any, msg: str) -> None:
            text = str(msg).strip()
            if self.listener is not None:
                self.listener(text)
            if severity in errors:
                self.errors.append(text)
                del self.errors[:-_MAX_KEPT]
                if getattr(self._capture, "on", False):
                    log.debug("%s", text)
                    return
            log.log(levels.get(severity, logging.INFO), "%s", text)

        @contextlib.contextmanager
        def capturing(self) -> Iterator[list[str]]:
            """Keep errors for the caller to report instead of logging them; yields the list."""
            self.errors.clear()
            self._capture.on = True
            try:
                yield self.errors
            finally:
                self._capture.on = False

        def last_error(self) -> str:
            return self.errors[-1] if self.errors else ""

    return RoutedLogger()
