"""``edgert run --task vad|wakeword|asr``: the speech chain from a PipelineConfig.

``--model`` is the model of the task's own stage (Silero ``.onnx`` for vad, a word classifier
``.onnx`` for wakeword, a Whisper folder for asr); the other stages of ``speech.chain`` take theirs from
the config (``speech.vad.model``, ``speech.wakeword.models``, ``speech.asr.model``). Without
``speech.chain`` the task's stage runs alone, after VAD when ``speech.vad.model`` is set.

Whisper's token search (``speech.asr.decoding`` ...) takes its flags in :mod:`edgert.cli.speech_flags`.
"""

from __future__ import annotations

import json
import logging
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from edgert.config import PipelineConfig
from edgert.errors import ConfigError

__all__ = ["build_chain", "cli_run", "format_speech_summary", "resolve_chain"]

log = logging.getLogger(__name__)


def resolve_chain(config: PipelineConfig) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The stages to run and each one's model(s), from the task, ``--model`` and ``speech``."""
    speech = config.speech
    task = config.task
    if task not in ("vad", "wakeword", "asr"):
        raise ConfigError(f"task {task} is not a speech task (vad, wakeword, asr)")
    models: dict[str, Any] = {
        "vad": speech.vad.model,
        "wakeword": tuple(speech.wakeword.models),
        "asr": speech.asr.model,
    }
    if config.model.path:
        models[task] = (config.model.path,) if task == "wakeword" else config.model.path
    chain: tuple[str, ...] = tuple(speech.chain)
    if not chain:
        chain = (task,) if task == "vad" or not models["vad"] else ("vad", task)
    elif task not in chain:
        raise ConfigError(f"speech.chain ({', '.join(chain)}) does not include the task {task}")
    flag = {"vad": "speech.vad.model", "wakeword": "speech.wakeword.models", "asr": "speech.asr.model"}
    for stage in chain:
        if not models[stage]:
            hint = f"pass --model with --task {stage} or set {flag[stage]}"
            raise ConfigError(f"no model for the {stage} stage. Note: {hint}")
    return chain, {k: v for k, v in models.items() if k in chain}


def build_chain(config: PipelineConfig, on_event: Any = None) -> Any:
    """A :class:`~edgert.speech.chain.SpeechChain` with every stage of the config opened."""
    from edgert.speech.asr import Transcriber
    from edgert.speech.chain import SpeechChain
    from edgert.speech.vad import VoiceActivity
    from edgert.speech.wakeword import WakeWord

    chain, models = resolve_chain(config)
    backend, threads = config.model.backend, config.model.threads
    sp = config.speech
    with ExitStack() as stack:  # a stage that fails to open closes the ones already open
        vad = ww = asr = None
        if "vad" in chain:
            v = sp.vad
            vad = VoiceActivity(models["vad"], backend, threads, threshold=v.threshold, neg_threshold=v.neg_threshold,
                                min_speech_s=v.min_speech_s, min_silence_s=v.min_silence_s, pad_s=v.pad_s,
                                max_speech_s=v.max_speech_s, keep_audio="asr" in chain)
            stack.callback(vad.close)
        if "wakeword" in chain:
            w = sp.wakeword
            ww = WakeWord(models["wakeword"], w.melspec or None, w.embedding or None, backend, threads,
                          threshold=w.threshold, refractory_s=w.refractory_s)
            stack.callback(ww.close)
        if "asr" in chain:
            asr = Transcriber(models["asr"], backend, threads, max_tokens=sp.asr.max_tokens, decoder=sp.asr.decoder,
                              no_speech_threshold=sp.asr.no_speech_threshold,
                              logprob_threshold=sp.asr.logprob_threshold, **sp.asr.search())
            stack.callback(asr.close)
        result = SpeechChain(vad, ww, asr, listen_s=sp.wakeword.listen_s, on_event=on_event)
        stack.pop_all()
    return result


def format_speech_summary(summary: dict[str, Any]) -> str:
    src = summary.get("source") or {}
    lines = [
        f"chain      {' -> '.join(summary['chain'])}",
        f"source     {src.get('uri')} ({src.get('seconds')} s of audio, {src.get('overruns', 0)} overruns, "
        f"{src.get('skipped', 0)} skipped clips)",
        f"events     {summary['segments']} segments, {summary['wake_events']} wake words, "
        f"{summary['transcripts']} transcripts ({summary['stopped_by']})",
        f"rtf        {summary['rtf']} (busy seconds per second of audio; wall {summary['wall_rtf']})",
    ]
    for name, st in summary["stages"].items():
        lines.append(f"  {name:<9} {st['calls']:6d} calls  {st['seconds']:8.3f} s  rtf {st['rtf']}")
    if "asr" in summary["stages"]:
        lines.append(f"whisper    ran on {summary['whisper_audio_seconds']} s = "
                     f"{100 * summary['whisper_share']:.1f}% of the audio")
    return "\n".join(lines)


def _event_line(e: dict[str, Any]) -> str:
    where = f"{Path(e['stream']).name} " if e.get("stream") else ""
    if e["type"] == "transcript":
        return f"[{where}{e['start']:.2f}-{e['end']:.2f}] {e['text']}"
    if e["type"] == "wake":
        return f"[{where}{e['time']:.2f}] wake word {e['word']} ({e['score']:.2f})"
    return f"[{where}{e['start']:.2f}-{e['end']:.2f}] speech ({e['probability']:.2f})"


def cli_run(config: PipelineConfig, args: Any) -> int:
    """Entry point of ``edgert run`` for speech tasks: events to the sinks, a summary at the end."""
    from edgert.speech.audio import open_audio
    from edgert.speech.sinks import open_event_sink

    uri = config.source.uri or getattr(args, "source", None) or ""
    if not uri:
        raise ConfigError("no source given. Note: pass --source (a WAV/FLAC file, a folder, alsa://default, "
                          "mic://N) or set source.uri")
    max_chunks = config.runtime.max_frames
    ignored = [flag for flag, on in (("--power-budget", config.power.budget_w is not None),
                                     ("--loop", config.source.loop),
                                     ("--metrics", bool(getattr(args, "metrics", None)))) if on]
    if ignored:
        log.warning("speech tasks do not use %s yet; ignored", ", ".join(ignored))
    with ExitStack() as stack:
        sinks: list[Any] = []  # opened (truncated) last: a bad model or WAV leaves existing outputs alone
        # Without sinks (and without --json, whose stdout is the summary) events print as text lines.
        show = not config.sinks and not getattr(args, "json", False)

        def on_event(event: Any) -> None:
            data = event.to_dict()
            for sink in sinks:
                sink.write(data)
            if show:
                print(_event_line(data), flush=True)

        chain = stack.enter_context(build_chain(config, on_event))
        source = stack.enter_context(open_audio(uri, config.speech.chunk_samples))
        sinks.extend(stack.enter_context(open_event_sink(u)) for u in config.sinks)
        for sink in sinks:  # every one claimed: only now is any output truncated
            sink.begin()
        summary = chain.run(source, max_chunks)
    summary["task"] = config.task
    summary["models"] = {stage: list(m) if isinstance(m, tuple) else m for stage, m in resolve_chain(config)[1].items()}
    summary["sinks"] = list(config.sinks)
    out = sys.stderr if any(s.strip() == "jsonl://-" for s in config.sinks) else sys.stdout
    print(json.dumps(summary, indent=2) if getattr(args, "json", False) else format_speech_summary(summary), file=out)
    return 0
