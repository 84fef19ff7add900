"""The tasks edgert runs, named once: the config schema, the command line and the speech stages read them here.

``detect`` runs a detector on frames; the speech tasks run the audio chain (VAD, wake word, Whisper), whose
stages are the same names in the order they can be chained. This module sits at the bottom of the house
(no edgert imports), so the parser can name the tasks without importing the speech stack.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["DETECT", "SPEECH_TASKS", "TASKS", "SpeechTask", "Task", "is_speech", "stages_run"]

#: A speech stage, in chain order (a chain runs them in this order, each at most once).
SpeechTask = Literal["vad", "wakeword", "asr"]
#: Any task: detection, then the speech stages (tests/test_tasks.py keeps the two literals in step).
Task = Literal["detect", "vad", "wakeword", "asr"]

DETECT = "detect"
SPEECH_TASKS: tuple[str, ...] = get_args(SpeechTask)
TASKS: tuple[str, ...] = get_args(Task)


def is_speech(task: str) -> bool:
    """Whether ``task`` runs the speech chain (every task but detection does)."""
    return task in SPEECH_TASKS


def stages_run(task: str, chain: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a run of ``task`` executes: the task itself, and for a speech task the stages of its chain."""
    if not is_speech(task):
        return (task,)
    return tuple(dict.fromkeys((*chain, task)))
