"""Wake words with openWakeWord's three-model chain.

audio (int16-scaled floats) -> ``melspectrogram.onnx`` -> ``x / 10 + 2`` -> 76-frame windows, hop 8
frames (80 ms) -> ``embedding_model.onnx`` -> the last 16 embeddings [1, 16, 96] -> one classifier per
word -> score 0..1. This follows openWakeWord 0.4's streaming ``AudioFeatures``: audio is taken in
1280-sample steps, each step computes the mel frames of those samples plus the 480 before them (8 new
frames) and one new embedding. A word fires when its score reaches ``threshold``; it cannot fire again
for ``refractory_s``. As openWakeWord does, the first 5 scores of a stream are forced to 0 while the
buffers still hold start-up values.

The pretrained word models (hey_jarvis, alexa, ...) are CC BY-NC-SA 4.0: fine for tests and demos,
not to be shipped in a product.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from edgert.backends import Session, SessionOptions, open_session
from edgert.errors import InputError, ModelError
from edgert.speech.audio import SAMPLE_RATE, AudioChunk
from edgert.speech.results import WakeEvent

__all__ = ["EMBEDDING_WINDOW", "STEP_SAMPLES", "WakeWord"]

log = logging.getLogger(__name__)

STEP_SAMPLES = 1280  # 80 ms: one embedding per step
MEL_CONTEXT = 480  # samples before a step the mel model sees again (3 hops of 160)
MEL_FRAMES_PER_STEP = 8
MEL_BINS = 32
EMBEDDING_WINDOW = 76  # mel frames per embedding
EMBEDDING_DIM = 96
FEATURE_FRAMES = 16  # embeddings per classifier input
WARMUP_SCORES = 5


def _describe(sess: Session) -> str:
    return ", ".join(s.describe() for s in sess.input_specs)


class WakeWord:
    """Streaming wake-word detection for one or more words sharing one front end.

    ``words`` maps a name to a classifier ``.onnx`` (a list of paths uses the file stems, with any
    ``_v0.1`` version suffix dropped). The mel and embedding models default to the files of those
    names beside the first classifier, as openWakeWord ships them.
    """

    def __init__(
        self,
        words: Mapping[str, str | Path] | Sequence[str | Path],
        melspec: str | Path | None = None,
        embedding: str | Path | None = None,
        backend: str = "auto",
        threads: int = 0,
        threshold: float = 0.5,
        refractory_s: float = 2.0,
    ) -> None:
        if isinstance(words, Mapping):
            paths = {str(k): Path(v) for k, v in words.items()}
        else:
            paths = {Path(p).stem.split("_v")[0]: Path(p) for p in words}
        if not paths:
            raise ModelError("no wake-word model given: pass a classifier .onnx such as hey_jarvis_v0.1.onnx")
        if not 0.0 < threshold <= 1.0 or refractory_s < 0:
            raise ModelError(f"wake word: expected 0 < threshold <= 1 and refractory_s >= 0, got {threshold}, "
                             f"{refractory_s}")
        folder = next(iter(paths.values())).parent
        melspec = Path(melspec) if melspec else folder / "melspectrogram.onnx"
        embedding = Path(embedding) if embedding else folder / "embedding_model.onnx"
        for what, p in (("melspectrogram", melspec), ("embedding", embedding)):
            if not p.is_file():
                raise ModelError(f"{p}: openWakeWord {what} model not found (set speech.wakeword.{what} or put it "
                                 "beside the word model)")
        self.threshold = threshold
        self.refractory_s = refractory_s
        opts = SessionOptions(threads=threads)
        self._sessions: list[Session] = []
        try:
            self.mel = self._open(melspec, backend, SessionOptions(threads=threads,
                                  shapes={self._first_input(melspec): (1, MEL_CONTEXT + STEP_SAMPLES)}),
                                  "melspectrogram model (input float32[1,samples])")
            spec = self.mel.input_specs[0]
            if len(self.mel.input_specs) != 1 or len(spec.shape) != 2:
                raise ModelError(f"{melspec}: not openWakeWord's melspectrogram model: inputs are "
                                 f"{_describe(self.mel)}; expected input float32[1,samples]")
            self.embed = self._open(embedding, backend, SessionOptions(
                threads=threads, shapes={self._first_input(embedding): (1, EMBEDDING_WINDOW, MEL_BINS, 1)}),
                "embedding model (input float32[batch,76,32,1])")
            espec = self.embed.input_specs[0]
            if len(self.embed.input_specs) != 1 or tuple(espec.shape[1:]) != (EMBEDDING_WINDOW, MEL_BINS, 1):
                raise ModelError(f"{embedding}: not openWakeWord's embedding model: inputs are "
                                 f"{_describe(self.embed)}; expected float32[batch,76,32,1]")
            self.classifiers: dict[str, Session] = {}
            for name, path in paths.items():
                sess = self._open(path, backend, opts)
                cspec = sess.input_specs[0]
                if len(sess.input_specs) != 1 or tuple(cspec.shape[1:]) != (FEATURE_FRAMES, EMBEDDING_DIM):
                    raise ModelError(f"{path}: not an openWakeWord classifier: inputs are {_describe(sess)}; "
                                     "expected float32[1,16,96]")
                self.classifiers[name] = sess
        except BaseException:
            self.close()
            raise
        self.words = tuple(self.classifiers)
        self._mel_in = self.mel.inputs[spec.name]
        self._emb_in = self.embed.inputs[espec.name]
        self.steps = 0  # 80 ms steps run since open (a figure for stats)
        # What the buffers hold before any audio: openWakeWord starts its mel buffer at ones.
        self._idle_mel = np.ones((EMBEDDING_WINDOW, MEL_BINS), dtype=np.float32)
        self._idle_embedding = self._embedding(self._idle_mel)
        self.stream = ""
        self.reset()

    @staticmethod
    def _first_input(path: Path) -> str:
        from edgert.onnx_file import read_onnx  # reading the graph without its weights is cheap

        graph = read_onnx(path, weights=False).graph
        inits = {i.name for i in graph.initializer}
        names = [i.name for i in graph.input if i.name not in inits]
        if not names:
            raise ModelError(f"{path}: the model has no inputs")
        return str(names[0])

    def _open(self, path: Path, backend: str, options: SessionOptions, what: str = "") -> Session:
        try:
            sess = open_session(path, backend, options)
        except InputError as exc:  # the shape we ask for does not fit the model's input
            raise ModelError(f"{path}: not openWakeWord's {what}: {exc}") from None
        self._sessions.append(sess)
        return sess

    # -- streaming ---------------------------------------------------------------------------------
    def reset(self, stream: str = "") -> None:
        """Start a new stream: clear the audio, mel and embedding buffers and the refractory clocks."""
        self.stream = stream
        self._raw = np.zeros(MEL_CONTEXT, dtype=np.float32)  # int16-scaled history for the next step
        self._pending = np.zeros(0, dtype=np.float32)
        self._mel_buf = self._idle_mel.copy()
        self._features = np.repeat(self._idle_embedding[None, :], FEATURE_FRAMES, axis=0)
        self._pos = 0
        self._scored = 0
        self._last_fire: dict[str, float] = {}
        self.scores: dict[str, float] = dict.fromkeys(self.classifiers, 0.0)

    def _embedding(self, window: np.ndarray) -> np.ndarray:
        self._emb_in[0, :, :, 0] = window
        out: np.ndarray = next(iter(self.embed.infer().values())).reshape(-1)[:EMBEDDING_DIM].copy()
        return out

    def _step(self, samples: np.ndarray) -> list[WakeEvent]:
        # Scaled to int16 range: the mel model was exported for 16-bit PCM values.
        scaled = (samples * 32767.0).astype(np.float32)
        self._mel_in[0, :MEL_CONTEXT] = self._raw
        self._mel_in[0, MEL_CONTEXT:] = scaled
        self._raw = scaled[-MEL_CONTEXT:].copy()
        mel = next(iter(self.mel.infer().values()))
        frames = mel.reshape(-1, MEL_BINS)[-MEL_FRAMES_PER_STEP:] / 10.0 + 2.0
        self._mel_buf = np.concatenate((self._mel_buf[len(frames):], frames))
        self._features = np.concatenate((self._features[1:], self._embedding(self._mel_buf)[None, :]))
        self._pos += len(samples)
        self.steps += 1
        self._scored += 1
        now = self._pos / SAMPLE_RATE
        events: list[WakeEvent] = []
        for name, sess in self.classifiers.items():
            score = float(next(iter(sess.infer({sess.input_specs[0].name: self._features[None, :, :]}).values()))
                          .reshape(-1)[0])
            if self._scored <= WARMUP_SCORES:
                score = 0.0
            score = min(max(score, 0.0), 1.0)
            self.scores[name] = score
            last = self._last_fire.get(name)
            if score >= self.threshold and (last is None or now - last >= self.refractory_s):
                self._last_fire[name] = now
                events.append(WakeEvent(word=name, score=score, time=now, stream=self.stream))
        return events

    def process(self, chunk: AudioChunk) -> list[WakeEvent]:
        """Run every whole 80 ms step ``chunk`` completes; return the words that fired."""
        start = round(chunk.start * SAMPLE_RATE)
        if chunk.stream != self.stream or chunk.index == 0 or start < self._pos:  # time went back: a new stream
            self.reset(chunk.stream)
        if start != self._pos + len(self._pending):
            # A gap (the chain feeds only speech, a live source dropped audio): the buffers keep their
            # context, the clock jumps to where this chunk starts.
            self._pending = np.zeros(0, dtype=np.float32)
            self._pos = start
        samples = np.asarray(chunk.samples, dtype=np.float32)
        self._pending = np.concatenate((self._pending, samples)) if self._pending.size else samples
        events: list[WakeEvent] = []
        while len(self._pending) >= STEP_SAMPLES:
            step, self._pending = self._pending[:STEP_SAMPLES], self._pending[STEP_SAMPLES:]
            events += self._step(step)
        return events

    def score_audio(self, audio: np.ndarray) -> dict[str, np.ndarray]:
        """Scores of every 80 ms step of ``audio`` (a fresh stream), per word."""
        self.reset("score_audio")
        out: dict[str, list[float]] = {w: [] for w in self.classifiers}
        for i in range(len(audio) // STEP_SAMPLES):
            self._step(np.asarray(audio[i * STEP_SAMPLES : (i + 1) * STEP_SAMPLES], dtype=np.float32))
            for w, s in self.scores.items():
                out[w].append(s)
        return {w: np.array(v) for w, v in out.items()}

    def close(self) -> None:
        for sess in self._sessions:
            sess.close()
        self._sessions.clear()

    def __enter__(self) -> WakeWord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
