"""The stages of a speech task, from a PipelineConfig: which of ``vad``, ``wakeword``, ``asr`` run, and each opened.

``--model`` is the model of the task's own stage (Silero ``.onnx`` for vad, a word classifier ``.onnx`` for
wakeword, a Whisper folder for asr); the other stages of ``speech.chain`` take theirs from the config
(``speech.vad.model``, ``speech.wakeword.models``, ``speech.asr.model``). Without ``speech.chain`` the task's
stage runs alone, after VAD when ``speech.vad.model`` is set.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Callable

from edgert.config import PipelineConfig
from edgert.errors import BackendError, ConfigError
from edgert.tasks import SPEECH_TASKS

if TYPE_CHECKING:
    from edgert.speech.chain import Event, SpeechChain

__all__ = ["SPEECH_TASKS", "build_chain", "resolve_chain"]  # SPEECH_TASKS re-exported from edgert.tasks


def resolve_chain(config: PipelineConfig) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The stages to run and each one's model(s), from the task, ``--model`` and ``speech``."""
    speech = config.speech
    task = config.task
    if task not in SPEECH_TASKS:
        raise ConfigError(f"task {task} is not a speech task ({', '.join(SPEECH_TASKS)})")
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


def build_chain(config: PipelineConfig, on_event: Callable[[Event], None] | None = None,
                like: SpeechChain | None = None) -> SpeechChain:
    """A :class:`~edgert.speech.chain.SpeechChain` with every stage of the config opened.

    ``like``: a chain of the same run (another source): its Whisper is forked (one model in memory, sessions
    shared, state per chain; :meth:`Transcriber.fork`) instead of loaded again. VAD and wake word are opened
    per chain: they are small and carry a stream's state in their sessions' inputs.
    """
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
        if "asr" in chain and like is not None and like.asr is not None:
            try:
                asr = like.asr.fork()
            except BackendError:  # a backend that cannot fork its sessions: a second copy, as before
                asr = None
            if asr is not None:
                stack.callback(asr.close)
        if "asr" in chain and asr is None:
            asr = Transcriber(models["asr"], backend, threads, max_tokens=sp.asr.max_tokens, decoder=sp.asr.decoder,
                              no_speech_threshold=sp.asr.no_speech_threshold,
                              logprob_threshold=sp.asr.logprob_threshold,
                              condition_on_previous_text=sp.asr.condition_on_previous_text, **sp.asr.search())
            stack.callback(asr.close)
        result = SpeechChain(vad, ww, asr, listen_s=sp.wakeword.listen_s, on_event=on_event)
        stack.pop_all()
    return result
