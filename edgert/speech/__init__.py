"""Speech on the edge: voice activity, wake words and Whisper transcription.

A chain of small models where each gates the next: Silero VAD finds speech, openWakeWord listens for
a wake word inside it, and Whisper transcribes only the speech that follows (or, without a wake word
stage, every speech segment). Everything here imports with numpy alone; onnxruntime, soundfile,
tokenizers and sounddevice load when a stage or source is opened.
"""

from __future__ import annotations

from edgert.speech.asr import Transcriber
from edgert.speech.audio import AudioChunk, AudioSource, read_audio, resample
from edgert.speech.chain import SpeechChain
from edgert.speech.features import WhisperFeatures, log_mel_spectrogram, mel_filters
from edgert.speech.results import SpeechSegment, Transcript, WakeEvent
from edgert.speech.stages import SPEECH_TASKS, build_chain, resolve_chain
from edgert.speech.vad import VoiceActivity
from edgert.speech.wakeword import WakeWord
from edgert.speech.wer import normalize_text, wer, word_errors

__all__ = [
    "SPEECH_TASKS",
    "AudioChunk",
    "AudioSource",
    "SpeechChain",
    "SpeechSegment",
    "Transcriber",
    "Transcript",
    "VoiceActivity",
    "WakeEvent",
    "WakeWord",
    "WhisperFeatures",
    "build_chain",
    "log_mel_spectrogram",
    "mel_filters",
    "normalize_text",
    "read_audio",
    "resample",
    "resolve_chain",
    "wer",
    "word_errors",
]
