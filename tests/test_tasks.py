"""The task names live once, in edgert.tasks; its two literals agree and the config schema takes them."""

from __future__ import annotations

from edgert.config import PipelineConfig, SpeechConfig
from edgert.tasks import DETECT, SPEECH_TASKS, TASKS, stages_run


def test_tasks_are_detection_then_the_speech_stages() -> None:
    assert TASKS == (DETECT, *SPEECH_TASKS) == ("detect", "vad", "wakeword", "asr")


def test_stages_a_run_executes() -> None:
    assert stages_run("detect", ("vad", "asr")) == ("detect",)
    assert stages_run("vad", ("vad", "asr")) == ("vad", "asr")
    assert stages_run("asr") == ("asr",)


def test_the_schema_reads_them() -> None:
    from edgert.config import from_mapping

    assert from_mapping(PipelineConfig, {"task": "wakeword"}).task == "wakeword"
    assert from_mapping(SpeechConfig, {"chain": ["vad", "asr"]}).chain == ("vad", "asr")
