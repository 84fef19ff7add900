"""The exception tree.

Every error a user can cause (a bad config key, a missing model, a camera that vanished) is an
:class:`EdgertError`. The CLI prints ``str(error)`` as one line and exits 1. Anything else is a bug in
edgert and keeps its traceback.
"""

from __future__ import annotations

from types import TracebackType

__all__ = [
    "Aborted",
    "BackendError",
    "BackendUnavailable",
    "BuildError",
    "CalibrationError",
    "ConfigError",
    "EdgertError",
    "EngineCacheError",
    "InputError",
    "ModelError",
    "OutputClosed",
    "PowerError",
    "ReportError",
    "ServiceError",
    "SinkError",
    "SourceError",
    "first_line",
    "last_line",
    "process_ended",
    "reraise_as",
]


class EdgertError(Exception):
    """Base of every error caused by input, configuration or environment rather than an edgert bug."""


class ConfigError(EdgertError):
    """A configuration file or flag is wrong: unknown key, wrong type, invalid value."""


class ModelError(EdgertError):
    """A model file is missing, unreadable, or not what the requested task expects."""


class BackendUnavailable(EdgertError):
    """The requested backend cannot run here (package missing, no GPU). The message names the fix."""


class BackendError(EdgertError):
    """The backend failed while loading or running a model."""


class NoMoreContexts(BackendError):
    """A session cannot be forked again: its engine allows no further execution context (TensorRT 8.x gives each
    context of a dynamic-shape engine an optimization profile of its own). The GPU processor then runs fewer slots."""


class InputError(EdgertError):
    """Data handed to a session or stage does not match what it expects (name, shape, dtype)."""


class BuildError(EdgertError):
    """An engine could not be built (parser error, unsupported layer, out of memory)."""


class EngineCacheError(EdgertError):
    """An engine file does not match this machine (other TensorRT version or GPU) or is damaged."""


class CalibrationError(EdgertError):
    """INT8 calibration could not run (no usable samples, unsupported model)."""


class SourceError(EdgertError):
    """A frame or audio source cannot be opened or has failed for good."""


class SinkError(EdgertError):
    """An output (file, display, server) cannot be opened or written."""


class OutputClosed(SinkError):
    """The reader of an output went away (``jsonl://-`` piped into ``head``): the run ends quietly."""


class PowerError(EdgertError):
    """A power meter or power budget is misconfigured."""


class ReportError(EdgertError):
    """A report page (``--report``) cannot be written."""


class ServiceError(EdgertError):
    """Installing or controlling the systemd service failed."""


class Aborted(Exception):
    """Raised inside a long call (a Whisper window's decoder steps) to end it once the run is aborted (a second
    signal). Not an error: the thread that catches it just stops."""


def first_line(exc: BaseException | str, fallback: str | None = None) -> str:
    """The first non-empty line of an exception's message, for a one-line error; ``fallback`` (default: the
    exception's type name) when the message is empty. Frameworks (ONNX Runtime, OpenCV, TensorRT) raise
    messages of many lines whose first says what went wrong."""
    lines = str(exc).strip().splitlines()
    if lines:
        return lines[0].strip()
    return fallback if fallback is not None else (exc if isinstance(exc, str) else type(exc).__name__)


def last_line(exc: BaseException | str, fallback: str | None = None) -> str:
    """The last non-empty line of an exception's message (where OpenCV and GStreamer put the cause); as
    :func:`first_line` otherwise."""
    lines = str(exc).strip().splitlines()
    if lines:
        return lines[-1].strip()
    return fallback if fallback is not None else (exc if isinstance(exc, str) else type(exc).__name__)


class _Reraise:
    """The context manager :func:`reraise_as` returns."""

    __slots__ = ("catch", "cls", "what")

    def __init__(self, cls: type[EdgertError], what: str, catch: tuple[type[BaseException], ...]) -> None:
        self.cls, self.what, self.catch = cls, what, catch

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Returns None (never swallows): nothing raised, one of ours, or another kind propagate unchanged.
        if exc is None or isinstance(exc, EdgertError) or not isinstance(exc, self.catch):
            return
        raise self.cls(f"{self.what}: {first_line(exc)}") from exc


def reraise_as(cls: type[EdgertError], what: str,
               catch: tuple[type[BaseException], ...] = (Exception,)) -> _Reraise:
    """A ``with`` block whose framework errors become ``cls("WHAT: first line of the message")``, chained.

    ``with reraise_as(BackendError, "ONNX Runtime failed"): sess.run(...)``. edgert's own errors pass
    through unchanged; ``catch`` narrows what is turned (default: every :class:`Exception`).
    """
    return _Reraise(cls, what, catch)


def process_ended(exitcode: int | None) -> str:
    """How a child process ended, for one-line errors: ``killed by SIGKILL``, ``exited with status 1``, or
    ``closed its pipe`` (no exit code yet: its end of the pipe closed first). The capture and tracking workers
    say it the same way."""
    import signal

    if exitcode is None:
        return "closed its pipe"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"
