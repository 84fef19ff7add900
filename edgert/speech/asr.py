"""Whisper transcription: log-mel -> encoder -> token search (greedy, or beam search with openai-whisper's
temperature fallback: :mod:`edgert.speech.decoding`) with the tokenizer in tokenizer.json.

The model folder holds ``encoder.onnx`` (``mel`` [1,80,3000] -> ``encoder_out`` [1,1500,384]),
``decoder.onnx`` (``tokens`` int64 [1,n] + ``encoder_out`` -> ``logits`` [1,n,vocab], no KV cache)
and ``tokenizer.json`` (Hugging Face tokenizers format).

The encoder has fixed shapes and runs through an ordinary :class:`~edgert.backends.Session`, so any
backend (TensorRT FP16 on a Jetson) can take it. The decoder's token axis grows by one every step,
while a Session allocates its buffers once for one shape. Two ways are offered:

* ``exact`` (the default on ONNX Runtime): ONNX Runtime fed the true length each step, with the
  cross-attention keys and values hoisted out and computed once per window
  (:mod:`edgert.speech.decoder_split`). Reopening a Session per length would reload the 60 MB decoder
  for every token.
* ``bucketed`` (the default on every other backend): fixed-shape Sessions for a few lengths
  (16, 32, 64, ...), opened when first needed, with the tail padded. The decoder is causal, so the
  logits at position ``n-1`` do not depend on the padding; a static-shape engine per bucket is what
  TensorRT builds best.

Beam search and best-of-N sampling ask for the next-token logits of several sequences at once
(:meth:`last_logits`). The exact decoder runs them as one batch: the exported decoder fixes its batch
axis at 1 in the declared shapes only, so the per-token part is loaded with that axis free, the hoisted
cross-attention tensors are repeated once per window for the beams, and the logits (which the export
reshapes to [1, n, B*vocab]) are read back as [B, n, vocab]; a check against one-row runs on first use
falls back to rows one by one if an export does not allow it. The bucketed decoder (fixed [1, L]
shapes, encoder_out [1, 1500, d]) runs the rows one after another.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from edgert._lazy import lazy_import
from edgert.backends import SessionOptions, gpu_backends, open_session
from edgert.errors import InputError, ModelError, reraise_as
from edgert.search_rules import (
    at_least_one,
    auto_decoding,
    decoding_problem,
    length_penalty_problem,
    patience_problem,
    temperatures_problem,
)
from edgert.speech.decoding import (
    Decoded,
    beam_search,
    decode_with_fallback,
    fails_checks,
    greedy,
    log_softmax,
    rank,
    sample,
)
from edgert.speech.features import N_FRAMES, N_SAMPLES, SAMPLE_RATE, WhisperFeatures
from edgert.speech.results import SpeechSegment, Transcript
from edgert.speech.whisper_decoders import (
    BUCKETS,
    END_TOKEN,
    _BucketedDecoder,
    _Decoder,
    _ExactOrtDecoder,
)

__all__ = ["END_TOKEN", "START_TOKENS", "Transcriber", "whisper_files"]

log = logging.getLogger(__name__)

#: <|startoftranscript|>, <|notimestamps|> for the English-only models; <|endoftext|> ends the text.
START_TOKENS: tuple[int, ...] = (50257, 50362)
PREV_TOKEN = 50360  # <|startofprev|> in the English-only vocabulary: the previous text follows, as a prompt
MAX_PROMPT = 223  # the reference's n_text_ctx // 2 - 1
BLANK_TOKEN = 220  # "Ġ": Whisper never lets the text start with a bare space
NO_SPEECH_TOKEN = 50361  # <|nocaptions|> in the English-only vocabulary
MAX_TOKENS = 224  # Whisper's sample_len: half the decoder's 448-token context


def _logsumexp(x: np.ndarray) -> float:
    m = float(np.max(x))
    return m + float(np.log(np.sum(np.exp(x - m))))


def _softmax_at(x: np.ndarray, i: int) -> float:
    return float(np.exp(float(x[i]) - _logsumexp(x)))


def whisper_files(model_dir: str | Path) -> tuple[Path, Path, Path]:
    """encoder.onnx, decoder.onnx and tokenizer.json of a Whisper folder, or a one-line ModelError."""
    d = Path(model_dir)
    if not d.is_dir():
        raise ModelError(f"{d}: a Whisper model is a folder holding encoder.onnx, decoder.onnx and tokenizer.json")
    files = (d / "encoder.onnx", d / "decoder.onnx", d / "tokenizer.json")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelError(f"{d}: Whisper folder lacks {', '.join(missing)} (needs encoder.onnx, decoder.onnx, "
                         "tokenizer.json)")
    return files


class Transcriber:
    """Whisper (tiny.en and other English-only exports): greedy decoding, or openai-whisper's beam search.

    ``transcribe(audio)`` takes 16 kHz mono float32 audio and returns a :class:`Transcript`; audio
    longer than 30 s is read in consecutive 30 s windows. ``transcribe_segment`` keeps a VAD
    segment's times.

    ``decoding``: ``greedy`` (the most probable token each step), ``beam`` (``beam_size`` beams,
    ``patience``, ranked by sum log-probability over length, or ``length_penalty`` alpha as in Google NMT)
    or ``auto`` (the config's default: beam 5 where the encoder runs on a GPU, beam 3 on the CPU, replacing
    ``beam_size``: :func:`edgert.search_rules.auto_decoding`; :attr:`auto_device` says which).
    ``temperatures``: openai-whisper's fallback schedule; ``(0.0,)`` decodes once, and with more a window
    whose text is repetitive (compression ratio above ``compression_ratio_threshold``) or improbable (mean
    log-probability below ``logprob_threshold``) is decoded again at the next temperature, by sampling
    ``best_of`` sequences. ``seed`` seeds that sampling.
    """

    def __init__(
        self,
        model_dir: str | Path,
        backend: str = "auto",
        threads: int = 0,
        max_tokens: int = MAX_TOKENS,
        decoder: Literal["auto", "exact", "bucketed"] = "auto",
        no_speech_threshold: float | None = 0.6,
        logprob_threshold: float = -1.0,
        decoding: Literal["auto", "greedy", "beam"] = "greedy",
        beam_size: int = 5,
        patience: float | None = None,
        length_penalty: float | None = None,
        temperatures: Sequence[float] = (0.0,),
        best_of: int = 5,
        compression_ratio_threshold: float | None = 2.4,
        seed: int = 0,
        condition_on_previous_text: bool = True,
    ) -> None:
        enc_path, dec_path, tok_path = whisper_files(model_dir)
        if not 1 <= max_tokens <= BUCKETS[-1] - len(START_TOKENS):
            raise InputError(f"max_tokens must be 1..{BUCKETS[-1] - len(START_TOKENS)}, got {max_tokens}")
        self._check_search(decoding, beam_size, patience, length_penalty, tuple(temperatures), best_of)
        tokenizers = lazy_import("tokenizers", "Whisper's tokenizer")
        with reraise_as(ModelError, f"{tok_path}: cannot read the tokenizer"):  # a plain Exception from Rust
            self.tokenizer = tokenizers.Tokenizer.from_file(str(tok_path))
        self.max_tokens = max_tokens
        self.no_speech_threshold = no_speech_threshold  # None: never drop a window as silence
        self.logprob_threshold = logprob_threshold
        self.decoding = decoding
        self.beam_size = beam_size
        self.patience = patience
        self.length_penalty = length_penalty
        self.temperatures = tuple(float(t) for t in temperatures)
        self.best_of = best_of
        self.compression_ratio_threshold = compression_ratio_threshold
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        #: windows decoded, and those decoded again at a higher temperature (at least once)
        self.stats: dict[str, int] = {"windows": 0, "fallback_windows": 0, "attempts": 0, "rescued_windows": 0}
        #: Greedy first, and beam search (``beam_size``) only for a window whose greedy text fails the fallback
        #: checks (repetitive or improbable): beam's accuracy where greedy went wrong, greedy's cost elsewhere.
        self.beam_rescue = False
        self.condition_on_previous_text = condition_on_previous_text
        self.next_prompt: tuple[int, ...] = ()  # the prompt for the audio after the last transcribe()
        #: Called after the encoder and after every decoder step: a long window still shows progress (the
        #: pipeline feeds systemd's watchdog from it).
        self.on_step: Callable[[], None] | None = None
        self.encoder = open_session(enc_path, backend, SessionOptions(threads=threads))
        try:
            self._check_encoder(enc_path)
            #: ``decoding='auto'``: which device chose (``gpu`` or ``cpu``); None when the decoding was given
            self.auto_device: str | None = None
            if decoding == "auto":  # the device decides: beam 5 on a GPU, the CPU's choice on the CPU
                self.auto_device = "gpu" if self.encoder.backend_name in gpu_backends() else "cpu"
                chosen, self.beam_size = auto_decoding(self.auto_device == "gpu")
                self.decoding = "beam" if chosen == "beam" else "greedy"
            if decoder == "auto":
                decoder = "exact" if self.encoder.backend_name == "onnxruntime" else "bucketed"
            self.decoder_mode = decoder
            self._decoder: _Decoder = (
                _ExactOrtDecoder(dec_path, threads) if decoder == "exact"
                else _BucketedDecoder(dec_path, backend, threads)
            )
        except BaseException:
            self.encoder.close()
            raise
        self._features = WhisperFeatures(self._n_mels)
        self._suppress: np.ndarray | None = None

    @staticmethod
    def _check_search(decoding: str, beam_size: int, patience: float | None, length_penalty: float | None,
                      temperatures: tuple[float, ...], best_of: int) -> None:
        problem = decoding_problem(decoding)
        if problem is not None:
            raise InputError(f"decoding: {problem}")
        problems = [("beam_size", at_least_one(beam_size)), ("best_of", at_least_one(best_of)),
                    ("patience", patience_problem(patience, beam_size)),
                    ("length_penalty", length_penalty_problem(length_penalty)),
                    ("temperatures", temperatures_problem(temperatures, decoding != "greedy"))]
        for name, problem in problems:
            if problem is not None:
                raise InputError(f"{name}: {problem}")

    def _check_encoder(self, path: Path) -> None:
        specs = self.encoder.input_specs
        if len(specs) != 1 or len(specs[0].shape) != 3 or specs[0].shape[2] != N_FRAMES:
            got = ", ".join(s.describe() for s in specs)
            raise ModelError(f"{path}: not a Whisper encoder: inputs are {got}; expected mel float32[1,80,3000]")
        mels = specs[0].shape[1]
        self._n_mels = mels if isinstance(mels, int) and mels > 0 else 80
        self._mel_name = specs[0].name
        self._enc_out_name = self.encoder.output_specs[0].name

    def _suppress_mask(self, vocab: int) -> np.ndarray:
        if self._suppress is None or self._suppress.shape[0] != vocab:
            mask = np.zeros(vocab, dtype=bool)
            mask[END_TOKEN + 1 :] = True  # every special token after <|endoftext|>: sot, notimestamps, times
            # Whisper's default suppress_tokens="-1": no symbol-only tokens, so silence cannot come out
            # as a confident "[BLANK_AUDIO]" or "(music)" that the no-speech rule would then keep.
            for token in self._non_speech_tokens():
                if 0 <= token < vocab:
                    mask[token] = True
            self._suppress = mask
        return self._suppress

    def _non_speech_tokens(self) -> set[int]:
        """The tokens of openai-whisper's ``Tokenizer.non_speech_tokens`` (symbols, brackets, music notes)."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += ["<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", '("', "((", "))", "(((", ")))",
                    "[[", "]]", "{{", "}}", "♪♪", "♪♪♪"]
        miscellaneous = set("♩♪♫♬♭♮♯")

        def encode(text: str) -> list[int]:
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

        result = {encode(" -")[0], encode(" '")[0]}
        for symbol in symbols + sorted(miscellaneous):
            for tokens in (encode(symbol), encode(" " + symbol)):
                if len(tokens) == 1 or (tokens and symbol in miscellaneous):
                    result.add(tokens[0])
        return result

    def _step_fn(self, first: np.ndarray, start: int = len(START_TOKENS)) -> Callable[[np.ndarray], np.ndarray]:
        """``step`` for :mod:`edgert.speech.decoding`: the suppression rules, then log-probabilities.

        ``first``: the logits after the start tokens (and the prompt before them: ``start`` tokens in all),
        shared by every search of the window.
        """

        def step(tokens: np.ndarray) -> np.ndarray:
            if self.on_step is not None:
                self.on_step()
            n = tokens.shape[1]
            raw = first[None, :] if n == start else self._decoder.last_logits(tokens)
            logits = np.where(self._suppress_mask(raw.shape[-1]), -np.inf, raw).astype(np.float32)
            if n == start:  # Whisper's SuppressBlank: no empty text, no leading space
                logits[:, BLANK_TOKEN] = -np.inf
                logits[:, END_TOKEN] = -np.inf
                logits = np.repeat(logits, tokens.shape[0], axis=0)
            return log_softmax(logits)

        return step

    def _attempt(self, step: Callable[[np.ndarray], np.ndarray], temperature: float,
                 no_speech_prob: float, decoding: str | None = None,
                 initial: tuple[int, ...] = START_TOKENS) -> Decoded:
        """One decoding of the window at ``temperature``: greedy or beam at 0, best-of sampling above.
        ``initial``: the start tokens, after the previous window's text as a prompt when there is one."""
        limit = min(self.max_tokens, self._context - len(initial))
        if temperature > 0:
            cands = sample(step, initial, END_TOKEN, limit, temperature, self.best_of, self._rng)
            best = rank(cands, self.length_penalty)
        elif (decoding or self.decoding) == "beam":
            best = rank(beam_search(step, initial, END_TOKEN, limit, self.beam_size, self.patience),
                        self.length_penalty)
        else:
            best = greedy(step, initial, END_TOKEN, limit)
        text = self.tokenizer.decode(list(best.tokens), skip_special_tokens=True).strip()
        return Decoded(best.tokens, best.sum_logprob, best.finished, temperature, text, no_speech_prob)

    @property
    def _context(self) -> int:
        """Tokens a decoder call can hold: Whisper's 448, or the largest bucket of the fixed-shape decoder."""
        return 448 if self.decoder_mode == "exact" else BUCKETS[-1]

    def _decode_window(self, audio: np.ndarray, ungated: bool = False, prompt: Sequence[int] = ()) -> Decoded:
        self._features(audio, out=self.encoder.inputs[self._mel_name])
        encoder_out = self.encoder.infer()[self._enc_out_name]
        if self.on_step is not None:
            self.on_step()
        self._decoder.set_encoder_out(encoder_out)
        # The previous text as a prompt, as the reference's transcribe does: <|startofprev|> text, then the start
        # tokens. Only as much as leaves max_tokens of room (all 223 tokens with the exact decoder; the fixed-shape
        # buckets hold 256 in all, so there the newest few dozen).
        room = max(self._context - len(START_TOKENS) - self.max_tokens - 1, 0)
        kept = list(prompt)[-min(room, MAX_PROMPT):] if prompt and room else []
        initial = (PREV_TOKEN, *kept, *START_TOKENS) if kept else START_TOKENS
        self.stats["prompted_windows"] = self.stats.get("prompted_windows", 0) + bool(kept)
        start = np.array([initial], dtype=np.int64)
        # The start tokens' last len(START_TOKENS) positions: <|startoftranscript|> gives Whisper's no-speech
        # probability (<|nocaptions|> right after it), the last one the first text token.
        tail = self._decoder.tail_logits(start, len(START_TOKENS))
        no_speech = float(_softmax_at(tail[0], NO_SPEECH_TOKEN)) if tail.shape[1] > NO_SPEECH_TOKEN else 0.0
        # a copy: the bucketed decoder's output buffer is reused
        step = self._step_fn(np.array(tail[-1]), len(initial))
        tried = decode_with_fallback(
            lambda t: self._attempt(step, t, no_speech, initial=initial), self.temperatures,
            self.compression_ratio_threshold, self.logprob_threshold, self.no_speech_threshold, ungated)
        # Beam rescue (greedy at one temperature): a window greedy got wrong by the checks is searched again
        # with beams, and the beam result is kept.
        if self.beam_rescue and self.decoding == "greedy" and len(tried) == 1 and fails_checks(
                tried[0], self.compression_ratio_threshold, self.logprob_threshold, self.no_speech_threshold, ungated):
            tried.append(self._attempt(step, 0.0, no_speech, decoding="beam", initial=initial))
            self.stats["rescued_windows"] += 1
        self.stats["windows"] += 1
        self.stats["attempts"] += len(tried)
        self.stats["fallback_windows"] += len(tried) > 1
        if len(tried) > 1:
            log.debug("Whisper window decoded at temperatures %s (kept %.1f)",
                      ", ".join(f"{d.temperature:.1f}" for d in tried), tried[-1].temperature)
        window = tried[-1]
        if not window.finished:
            log.warning("Whisper stopped at max_tokens=%d before the end token", self.max_tokens)
        return window

    def transcribe(self, audio: np.ndarray, start: float = 0.0, stream: str = "",
                   ungated: bool = False, prompt: Sequence[int] = ()) -> Transcript:
        """Transcribe 16 kHz mono float32 ``audio`` that starts at ``start`` seconds of ``stream``.

        As Whisper's own ``transcribe`` does, a window whose no-speech probability exceeds
        ``no_speech_threshold`` while its mean token log-probability is below ``logprob_threshold``
        is taken for silence: its text is dropped and the transcript says ``no_speech``.

        ``ungated``: no VAD chose this audio (the whole stream is read window by window). Whisper's
        log-probability exception then keeps its classic hallucination on a quiet room (" you" at a mean
        log-probability of -0.73 with a no-speech probability of 0.95), so the no-speech probability
        alone decides: nothing else stands between silence and a transcript.

        Long audio (over 30 s) is read in consecutive windows, each conditioned on the text before it when
        ``condition_on_previous_text`` is on (the reference's default): the previous windows' tokens are the
        window's prompt, reset after a window that needed a temperature above 0.5. ``prompt``: tokens before this
        audio (the chain passes the previous window of the same stream); :attr:`next_prompt` is the prompt for
        the audio that follows. Each window is one entry of the transcript's ``segments`` (start, end, text).
        """
        x = np.asarray(audio)
        if x.ndim != 1 or x.dtype != np.float32:
            raise InputError(f"Whisper input: expected float32 [samples] at 16 kHz, got {x.dtype}{list(x.shape)}")
        tokens: list[int] = []
        truncated = False
        sum_logprob, counted, no_speech, windows, silent = 0.0, 0, 0.0, 0, 0
        context = list(prompt) if self.condition_on_previous_text else []
        segments: list[tuple[float, float, str]] = []
        for off in range(0, max(len(x), 1), N_SAMPLES):
            piece = x[off : off + N_SAMPLES]
            w = self._decode_window(piece, ungated, context)
            windows += 1
            no_speech += w.no_speech_prob
            if (self.no_speech_threshold is not None and w.no_speech_prob > self.no_speech_threshold
                    and (ungated or w.avg_logprob < self.logprob_threshold)):
                silent += 1
                continue
            if self.condition_on_previous_text:
                context = [] if w.temperature > 0.5 else [*context, *w.tokens][-MAX_PROMPT:]
            t0 = start + off / SAMPLE_RATE
            segments.append((t0, t0 + len(piece) / SAMPLE_RATE, w.text))
            tokens += w.tokens
            truncated = truncated or not w.finished
            sum_logprob += w.sum_logprob
            counted += len(w.tokens) + 1
        text = self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        self.next_prompt = tuple(context)
        return Transcript(text=text, start=start, end=start + len(x) / SAMPLE_RATE, tokens=tuple(tokens),
                          stream=stream, truncated=truncated, segments=tuple(segments),
                          avg_logprob=sum_logprob / counted if counted else None,
                          no_speech_prob=min(max(no_speech / windows, 0.0), 1.0), no_speech=silent == windows)

    def transcribe_segment(self, segment: SpeechSegment, ungated: bool = False,
                           prompt: Sequence[int] = ()) -> Transcript:
        """Transcribe a VAD segment (it must carry its audio); the transcript keeps its times.

        ``ungated``: the segment is a window of the whole stream, not chosen by a VAD (see :meth:`transcribe`).
        """
        if segment.audio is None:
            raise InputError("SpeechSegment has no audio: the VAD must keep segment audio for transcription")
        t = self.transcribe(segment.audio, segment.start, segment.stream, ungated=ungated, prompt=prompt)
        return dataclasses.replace(t, start=segment.start, end=segment.end)

    def fork(self) -> Transcriber:
        """A second Transcriber on the same model: the encoder and decoder sessions forked (one copy of the
        weights in memory, ONNX Runtime's ``run`` being thread-safe), the tokenizer shared, and everything a
        window changes (input and output buffers, the hoisted cross-attention tensors, the prompt, the search
        settings a budget narrows, the statistics, the sampling generator) its own. Several sources of one run
        each take a fork; a fork transcribes exactly as the original does."""
        twin = copy.copy(self)
        twin.encoder = self.encoder.fork()
        try:
            twin._decoder = self._decoder.fork()
        except BaseException:
            twin.encoder.close()
            raise
        twin.stats = {k: 0 for k in self.stats}
        twin._rng = np.random.default_rng(self._seed)
        twin.next_prompt = ()
        twin.on_step = None
        twin._features = WhisperFeatures(self._n_mels)
        return twin

    def close(self) -> None:
        self.encoder.close()
        self._decoder.close()

    def __enter__(self) -> Transcriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
