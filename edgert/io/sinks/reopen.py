"""SIGHUP: file sinks open their path again, so that a log rotated away (logrotate's ``create`` mode, then
``postrotate`` sending SIGHUP) is not written on for the rest of the run.

The run's signal handler (:mod:`edgert.pipeline.signals`) calls :func:`request_reopen`; each file sink compares
:func:`reopen_generation` with the one it opened at before its next write, and reopens when they differ. An int
read by the sinks' threads and bumped by the main thread's handler: no lock needed for one counter.
"""

from __future__ import annotations

__all__ = ["reopen_generation", "request_reopen"]

_generation = 0


def request_reopen() -> None:
    global _generation
    _generation += 1


def reopen_generation() -> int:
    return _generation
