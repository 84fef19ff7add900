"""Activation statistics: run the FP32 model in ONNX Runtime with its intermediate tensors as outputs.

The model is copied with the wanted tensors added as graph outputs. Each sample runs once per chunk
of tensors, and every tensor goes straight into its :class:`~edgert.calib.histograms.TensorHistogram`
and is dropped: memory is one sample's exposed activations (at most ``budget_mb`` per chunk) plus a
fixed 32 KiB per tensor, whatever the number of images. (ONNX Runtime's own entropy calibrator keeps
every activation of every image until the end: ~98 MiB per image on NanoDet.)
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgert.backends.onnxruntime import cpu_session
from edgert.calib.equalize import channel_absmax
from edgert.calib.histograms import DEFAULT_BINS, TensorHistogram
from edgert.errors import CalibrationError, ModelError, reraise_as

__all__ = ["ActivationCollector", "tensor_bytes"]

log = logging.getLogger(__name__)

#: Filler of one model input: writes a sample into ``out`` (the preprocessing's job).
Fill = Callable[[np.ndarray], None]


def tensor_bytes(model: onnx.ModelProto, names: Sequence[str], batch: int = 1) -> dict[str, int]:
    """Estimated bytes of each tensor per run, from inferred shapes (unknown dims count as ``batch``;
    unknown shapes as 4 MiB, a guess on the safe side for image models)."""
    shapes: dict[str, list[int | None]] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    out: dict[str, int] = {}
    for name in names:
        dims = shapes.get(name)
        if dims is None:
            out[name] = 4 << 20
            continue
        n = 1
        for d in dims:
            n *= d if d else batch
        out[name] = 4 * n
    return out


def _chunks(names: Sequence[str], sizes: dict[str, int], budget: int) -> list[list[str]]:
    chunks: list[list[str]] = [[]]
    used = 0
    for name in names:
        if chunks[-1] and used + sizes[name] > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(name)
        used += sizes[name]
    return chunks


@dataclass
class ActivationCollector:
    """Histograms of ``tensors`` of ``model`` (a prepared ONNX model) over a stream of samples."""

    model: onnx.ModelProto
    tensors: Sequence[str]
    budget_mb: float = 512.0
    bins: int = DEFAULT_BINS
    threads: int = 0
    #: tensors (of ``tensors``) whose largest finite |x| per channel is kept too (``channel_max``: a vector
    #: per tensor, so memory stays flat in the number of images), for :mod:`.equalize`
    channel_tensors: Collection[str] = ()

    def __post_init__(self) -> None:
        inits = {i.name for i in self.model.graph.initializer}
        inputs = [i for i in self.model.graph.input if i.name not in inits]
        if len(inputs) != 1:
            names = ", ".join(i.name for i in inputs)
            raise CalibrationError(f"calibration feeds models with one input; this one has {len(inputs)} ({names})")
        self.input_name = inputs[0].name
        sizes = tensor_bytes(self.model, self.tensors)
        self.chunks = _chunks(list(self.tensors), sizes, int(self.budget_mb * (1 << 20)))
        self.bytes_per_sample = sum(sizes.values())
        if len(self.chunks) > 1:
            log.info("exposing %d tensors (%.0f MiB per sample) in %d runs per sample to stay under %.0f MiB",
                     len(self.tensors), self.bytes_per_sample / 2**20, len(self.chunks), self.budget_mb)
        self.histograms = {name: TensorHistogram(name, self.bins) for name in self.tensors}
        self.channel_max: dict[str, np.ndarray] = {}
        self._channels = set(self.channel_tensors) & set(self.tensors)
        self.samples = 0
        self._sessions = []
        outputs = {o.name for o in self.model.graph.output}
        for chunk in self.chunks:
            m = onnx.ModelProto()
            m.CopyFrom(self.model)
            for name in chunk:
                if name not in outputs and name != self.input_name:
                    m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            fetch = [n for n in chunk if n != self.input_name]
            with reraise_as(ModelError, "ONNX Runtime cannot load the model for calibration"):
                sess = cpu_session(m, self.threads, spin_wait=True, what="calibration")
            del m
            self._sessions.append((sess, fetch, self.input_name in chunk))

    def update(self, feed: np.ndarray) -> None:
        """Run one input batch and fold every exposed tensor into its histogram."""
        for sess, fetch, wants_input in self._sessions:
            if wants_input:
                self.histograms[self.input_name].update(feed)
            if not fetch:
                continue
            with reraise_as(CalibrationError, "ONNX Runtime failed on a calibration sample"):
                values = sess.run(fetch, {self.input_name: feed})
            for name, value in zip(fetch, values):
                self.histograms[name].update(value)
                if name in self._channels:
                    got = channel_absmax(value)
                    seen = self.channel_max.get(name)
                    self.channel_max[name] = got if seen is None or seen.shape != got.shape else np.maximum(seen, got)
            del values
        self.samples += 1

    def run(self, samples: Iterable[object], fill: Callable[[object, np.ndarray], None], buffer: np.ndarray,
            progress: bool = True, total: int | None = None) -> dict[str, TensorHistogram]:
        """Preprocess each sample into ``buffer`` with ``fill`` and collect; returns the histograms."""
        from tqdm import tqdm

        bar = tqdm(samples, total=total, desc="calibrating", unit="img", disable=not progress, leave=False)
        for sample in bar:
            fill(sample, buffer)
            self.update(buffer)
        bar.close()
        return self.histograms

    def close(self) -> None:
        self._sessions = []
