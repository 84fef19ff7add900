"""Flags of ``edgert run`` that apply to one kind of task only, refused in one line naming them on the other.

Vision-only flags (boxes, tracking, the detection processors' slots and batches, video looping) mean nothing
to a speech task; Whisper's search flags mean nothing to detection. Either way the run stops before anything
opens, with every such flag named: a flag is never warned about and ignored. The config keys behind them are
refused by the pipeline itself (:func:`edgert.pipeline.speech.refuse_vision_keys`), so the Python API and a
YAML file get the same answer.
"""

from __future__ import annotations

import argparse
from typing import Any

from edgert.errors import ConfigError

__all__ = ["SPEECH_ONLY_FLAGS", "VISION_ONLY_FLAGS", "refuse_flags", "speech_lines"]

_SPEECH_TASKS = ("vad", "wakeword", "asr")

#: flag -> argparse destination, for flags only a detection task reads.
VISION_ONLY_FLAGS: dict[str, str] = {
    "--conf": "conf", "--iou": "iou", "--classes": "classes", "--track": "track", "--processing": "processing",
    "--gpu-pipeline": "gpu_pipeline", "--slots": "slots", "--memory": "memory", "--cuda-graph": "cuda_graph",
    "--fixed-batch": "fixed_batch",
    "--batch": "batch", "--batch-timeout-ms": "batch_timeout_ms", "--preload": "preload", "--loop": "loop",
    "--realtime": "realtime", "--stagger": "stagger",
    "--line": "line", "--zone": "zone", "--capture": "capture",
    "--track-workers": "track_workers",
}

#: flag -> argparse destination, for flags only a speech task reads (Whisper's token search).
SPEECH_ONLY_FLAGS: dict[str, str] = {
    "--decoding": "decoding", "--beam-size": "beam_size", "--fallback": "fallback", "--best-of": "best_of",
}


def _given(args: argparse.Namespace, flags: dict[str, str]) -> list[str]:
    given = [(flag, getattr(args, dest, None)) for flag, dest in flags.items()]
    return [flag for flag, value in given if value not in (None, False) and value != []]  # [] : no --line given


def refuse_flags(task: str, args: argparse.Namespace) -> None:
    """Raise :class:`ConfigError` naming every given flag that cannot apply to ``task``."""
    if task in _SPEECH_TASKS:
        wrong = _given(args, VISION_ONLY_FLAGS)
        if wrong:
            raise ConfigError(f"{', '.join(wrong)}: detection only; task {task} runs the speech chain")
    else:
        wrong = _given(args, SPEECH_ONLY_FLAGS)
        if wrong:
            raise ConfigError(f"{', '.join(wrong)}: Whisper's token search applies to --task asr (or a speech.chain "
                              f"with asr), not task {task}")


def speech_lines(speech: dict[str, Any]) -> list[str]:
    """The speech part of the text summary: the chain, events, real-time factors, Whisper's share, what was cut."""
    lines = [
        f"chain      {' -> '.join(speech['chain'])} ({speech['audio_seconds']} s of audio)",
        f"events     {speech['segments']} segments, {speech['wake_events']} wake words, "
        f"{speech['transcripts']} transcripts",
        f"rtf        {speech['rtf']} (busy seconds per second of audio; wall {speech['wall_rtf']})",
    ]
    for name, st in speech["stages"].items():
        lines.append(f"  {name:<9} {st['calls']:6d} calls  {st['seconds']:8.3f} s  rtf {st['rtf']}")
    if "asr" in speech["stages"]:
        lines.append(f"whisper    ran on {speech['whisper_audio_seconds']} s = "
                     f"{100 * speech['whisper_share']:.1f}% of the audio")
    budget = speech.get("budget")
    if budget:
        lines.append(f"budget     {budget['windows_narrowed']} windows narrowed to greedy, {budget['windows_shed']} "
                     f"shed ({budget['audio_shed_s']} s of audio)")
    cut = speech.get("cut") or {}
    if any(cut.values()):
        lines.append(f"cut        {cut.get('open_segment_s', 0)} s of an open segment, "
                     f"{cut.get('untranscribed_s', 0)} s waiting for Whisper, {cut.get('queued_segments', 0)} queued "
                     "segments")
    return lines
