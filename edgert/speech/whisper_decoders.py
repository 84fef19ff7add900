"""The two ways a Whisper decoder without a KV cache runs each step (:class:`edgert.speech.asr.Transcriber`
chooses): ``exact`` (ONNX Runtime on the true token count, the graph split by :mod:`edgert.speech.decoder_split`)
and ``bucketed`` (fixed-shape Sessions for a few lengths, the tail padded). The reasons are in asr's docstring.
"""

from __future__ import annotations

import copy
import logging
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from edgert.backends import Session, SessionOptions, open_session
from edgert.backends.onnxruntime import cpu_session, load_ort_session
from edgert.errors import BackendError, ModelError, reraise_as
from edgert.onnx_file import read_onnx
from edgert.speech.decoder_split import TAIL, add_last_logits, split_decoder

__all__ = ["BUCKETS", "END_TOKEN", "check_decoder_inputs"]

log = logging.getLogger(__name__)

END_TOKEN = 50256  # <|endoftext|>: the bucketed decoder pads with it
BUCKETS = (16, 32, 64, 128, 256)


class _Decoder(Protocol):
    def logits(self, tokens: np.ndarray, n: int) -> np.ndarray: ...
    def last_logits(self, tokens: np.ndarray) -> np.ndarray: ...
    def tail_logits(self, tokens: np.ndarray, k: int) -> np.ndarray: ...
    def set_encoder_out(self, encoder_out: np.ndarray) -> None: ...
    def fork(self) -> _Decoder: ...
    def close(self) -> None: ...


def check_decoder_inputs(path: Path, names: list[str]) -> None:
    if sorted(names) != ["encoder_out", "tokens"]:
        raise ModelError(f"{path}: not a Whisper decoder without KV cache: inputs are {', '.join(names)}; "
                         "expected tokens, encoder_out")


def _ort_from_proto(model: onnx.ModelProto, what: str, threads: int) -> Any:
    """An ONNX Runtime CPU session on an in-memory model, with the backend's options (no spin-waiting: a
    decoder step is hundreds of small nodes, and spinning threads take the cores the other stages need)."""
    with reraise_as(ModelError, f"{what}: ONNX Runtime cannot load it"):  # onnxruntime's pybind11 exceptions
        return cpu_session(model, threads, what="the ONNX Runtime backend")


class _ExactOrtDecoder:
    """ONNX Runtime run on the true token count each step.

    The decoder is split (:mod:`edgert.speech.decoder_split`): the cross-attention keys and values are
    computed once per window instead of once per token, same arithmetic, about 4x less work a step; and the
    vocabulary projection runs for the positions the search reads (the last; the last two at the start).
    """

    def __init__(self, path: Path, threads: int) -> None:
        model = read_onnx(path)
        inits = {i.name for i in model.graph.initializer}
        check_decoder_inputs(path, [i.name for i in model.graph.input if i.name not in inits])
        split = split_decoder(model)
        self._cross: Any = None
        self._hoisted: list[str] = []
        self._last: str | None = None  # the last-positions output (decoder_split.add_last_logits)
        self._last_ok: bool | None = None  # None: k = 1 not checked against k = n yet
        if split is None:
            self._step: Any = load_ort_session(path, ["CPUExecutionProvider"], threads)
        else:
            cross, step, self._hoisted = split
            for inp in step.graph.input:  # declared [1, n]; the graph itself reads the batch from the tokens
                if inp.name == "tokens" and inp.type.tensor_type.shape.dim:
                    inp.type.tensor_type.shape.dim[0].dim_param = "batch"
            self._cross = _ort_from_proto(cross, f"{path} (cross-attention part)", threads)
            tail = onnx.ModelProto()
            tail.CopyFrom(step)
            self._last = add_last_logits(tail)
            try:
                self._step = _ort_from_proto(tail if self._last else step, f"{path} (per-token part)", threads)
            except ModelError:
                if self._last is None:
                    raise
                # The last-positions branch is an optimization: a graph it does not fit loads without it.
                log.info("%s: the last-position logits do not fit this decoder; computing all positions", path)
                self._last = None
                self._step = _ort_from_proto(step, f"{path} (per-token part)", threads)
            del tail, step, cross
        del model
        self._out = self._step.get_outputs()[0].name
        self._feed: dict[str, np.ndarray] = {}
        self._tiled: dict[str, np.ndarray] = {}  # the hoisted tensors repeated for a batch of sequences
        self.batched: bool | None = None if self._cross is not None else False  # None: not tried yet

    def set_encoder_out(self, encoder_out: np.ndarray) -> None:
        if self._cross is None:
            self._feed = {"encoder_out": encoder_out}
            return
        with reraise_as(BackendError, "Whisper decoder failed"):  # onnxruntime's pybind11 exception types
            values = self._cross.run(self._hoisted, {"encoder_out": encoder_out})
        self._feed = dict(zip(self._hoisted, values))
        self._tiled = {}

    def _run(self, tokens: np.ndarray, feed: dict[str, np.ndarray], k: int) -> np.ndarray:
        """Logits [B, k, vocab] of the last ``k`` positions (all positions computed without the tail branch)."""
        b, n = tokens.shape
        if self._last is not None:
            feed = {**feed, TAIL: np.array([-k], dtype=np.int64)}
        with reraise_as(BackendError, "Whisper decoder failed"):  # onnxruntime's pybind11 exception types
            out: np.ndarray = self._step.run([self._out], {"tokens": tokens, **feed})[0]
        if self._last is not None:
            return out.reshape(b, k, -1)
        return out.reshape(b, n, -1)[:, n - k :]

    def logits(self, tokens: np.ndarray, n: int) -> np.ndarray:
        """Logits [n, vocab] of the first ``n`` tokens of row 0."""
        out: np.ndarray = self._run(np.ascontiguousarray(tokens[:1, :n]), self._feed, n)[0]
        return out

    def tail_logits(self, tokens: np.ndarray, k: int) -> np.ndarray:
        """Logits [k, vocab] of the last ``k`` positions of row 0."""
        k = min(k, tokens.shape[1])
        if self._last is not None and not self._last_ok:  # unchecked or refused: every position
            return self.logits(tokens, tokens.shape[1])[-k:]
        out: np.ndarray = self._run(np.ascontiguousarray(tokens[:1]), self._feed, k)[0]
        return out

    def _batch_feed(self, b: int) -> dict[str, np.ndarray]:
        """The hoisted tensors for ``b`` sequences: repeated once per window, sliced for smaller batches."""
        if b == 1:
            return self._feed
        have = next(iter(self._tiled.values())).shape[0] if self._tiled else 0
        if have < b:
            self._tiled = {k: np.repeat(v, b, axis=0) for k, v in self._feed.items()}
            have = b
        return self._tiled if have == b else {k: v[:b] for k, v in self._tiled.items()}

    def _fast(self, tokens: np.ndarray) -> np.ndarray:
        """Last-position logits [B, vocab] in one run: the last position alone when it checked out."""
        b, n = tokens.shape
        k = 1 if self._last is not None and self._last_ok else n
        return self._run(tokens, self._batch_feed(b), k)[:, -1]

    def _agrees(self, tokens: np.ndarray, reference: np.ndarray) -> bool:
        try:
            got = self._fast(tokens)
        except (BackendError, ValueError):
            return False
        return got.shape == reference.shape and bool(np.allclose(got, reference, atol=1e-3))

    def last_logits(self, tokens: np.ndarray) -> np.ndarray:
        """Next-token logits [B, vocab] of B sequences of one length.

        One run for all B and the last position only, once a first call has checked both against every
        position's logits row by row (an export that does not allow one of them keeps the plain way for it).
        """
        b, n = tokens.shape
        if (self._last is not None and self._last_ok is None) or (b > 1 and self.batched is None):
            rows = np.stack([self.logits(tokens[i : i + 1], n)[-1] for i in range(b)])
            if self._last is not None and self._last_ok is None:
                self._last_ok = True
                self._last_ok = self._agrees(tokens[:1], rows[:1])
            if b > 1 and self.batched is None:
                self.batched = self._agrees(tokens, rows)
                if not self.batched:
                    log.warning("Whisper decoder: this export does not run several sequences in one batch; "
                                "beams run one after another")
            return rows
        if b == 1 or self.batched:
            return self._fast(tokens)
        return np.concatenate([self._fast(tokens[i : i + 1]) for i in range(b)])

    def fork(self) -> _ExactOrtDecoder:
        """The same ONNX Runtime sessions (their ``run`` is thread-safe) with this window's state of its own."""
        twin = copy.copy(self)
        twin._feed, twin._tiled = {}, {}
        return twin

    def close(self) -> None:
        self._step = None
        self._cross = None
        self._feed = {}
        self._tiled = {}


class _BucketedDecoder:
    """Fixed-shape Sessions for a few token lengths; the tail is padded (the decoder is causal)."""

    def __init__(self, path: Path, backend: str, threads: int,
                 pool: tuple[dict[int, Session], threading.Lock] | None = None) -> None:
        self._path = path
        self._backend = backend
        self._threads = threads
        self._sessions: dict[int, Session] = {}  # this decoder's own (forks of the pool's, or the pool's)
        #: the first Session opened per length, shared by the forks (each forks it for buffers of its own)
        self._pool = pool if pool is not None else ({}, threading.Lock())
        self._fresh: set[int] = set()  # buckets whose encoder_out buffer holds the current utterance
        self._encoder_out: np.ndarray | None = None

    def _session(self, length: int) -> Session:
        sess = self._sessions.get(length)
        if sess is None:
            shared, lock = self._pool
            with lock:
                base = shared.get(length)
                if base is None:
                    opts = SessionOptions(threads=self._threads, shapes={"tokens": (1, length)})
                    sess = open_session(self._path, self._backend, opts)
                    check_decoder_inputs(self._path, [s.name for s in sess.input_specs])
                    shared[length] = sess
                else:
                    sess = base.fork()
            self._sessions[length] = sess
        return sess

    def fork(self) -> _BucketedDecoder:
        """Buffers of its own on the same engines (a fork per bucket, opened when first needed)."""
        return _BucketedDecoder(self._path, self._backend, self._threads, self._pool)

    def set_encoder_out(self, encoder_out: np.ndarray) -> None:
        self._encoder_out = encoder_out
        self._fresh.clear()

    def logits(self, tokens: np.ndarray, n: int) -> np.ndarray:
        length = next((b for b in BUCKETS if b >= n), BUCKETS[-1])
        sess = self._session(length)
        if length not in self._fresh and self._encoder_out is not None:
            np.copyto(sess.inputs["encoder_out"], self._encoder_out)
            self._fresh.add(length)
        buf = sess.inputs["tokens"]
        buf.fill(END_TOKEN)
        buf[0, :n] = tokens[0, :n]
        out: np.ndarray = sess.infer()[sess.output_specs[0].name][0, :n]
        return out

    def tail_logits(self, tokens: np.ndarray, k: int) -> np.ndarray:
        """Logits [k, vocab] of the last ``k`` positions of row 0."""
        n = tokens.shape[1]
        return self.logits(tokens, n)[max(n - k, 0) :]

    def last_logits(self, tokens: np.ndarray) -> np.ndarray:
        """Next-token logits [B, vocab]: a fixed [1, L] engine, so the rows run one after another."""
        n = tokens.shape[1]
        out = np.empty((tokens.shape[0], 0), dtype=np.float32)
        for i in range(tokens.shape[0]):
            row = self.logits(tokens[i : i + 1], n)[n - 1]  # a view of the Session's output buffer: copy it out
            if i == 0:
                out = np.empty((tokens.shape[0], row.shape[0]), dtype=row.dtype)
            out[i] = row
        return out

    def close(self) -> None:
        for sess in self._sessions.values():
            sess.close()
        self._sessions.clear()
