"""The CPU processor: host preprocessing, the session, host decode + NMS, on a few slots at once.

Each slot owns a fork of one loaded model (``Session.fork``: its own input and output buffers, the model
shared) plus its own :class:`~edgert.vision.preprocess.Preprocessor` and decoder, which keep scratch buffers
and so are one per thread. A slot letterboxes straight into its session's bound input buffer, runs the
model, and decodes from the session's bound output buffers: nothing is copied between stages and nothing is
allocated per frame but the detections themselves.

Why several slots instead of one thread per stage: with two frames in flight on two single-threaded
sessions, one frame's preprocessing and NMS run while the other's network runs, and neither session waits
for a second intra-op thread through the serial parts of the network. On ONNX Runtime each session gets
``cores / slots`` threads unless ``model.threads`` says otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import BackendError
from edgert.pipeline.processor import Processor, ProcessorSlot, slots_wanted
from edgert.stats import STAGES
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.detections import Detections
from edgert.vision.preprocess import Preprocessor

if TYPE_CHECKING:
    from edgert.backends import Session
    from edgert.pipeline.parts import JSONDict
    from edgert.vision.detector import Detector

__all__ = ["CpuProcessor", "CpuSlot"]

log = logging.getLogger(__name__)

_PRE, _INFER, _POST = STAGES.index("preprocess"), STAGES.index("infer"), STAGES.index("postprocess")


class CpuSlot(ProcessorSlot):
    """One session fork with its own preprocessor and decoder; ``batch`` frames per engine call."""

    def __init__(self, session: Session, preprocessor: Preprocessor, decoder: Decoder, input_name: str,
                 owned: bool, batch: int = 1) -> None:
        self.session = session
        self.preprocessor = preprocessor
        self.decoder = decoder
        self.input = session.inputs[input_name]
        self.batch = batch
        # Where each sample of a batch is letterboxed: the whole input at batch 1, else one row of it.
        self._targets = [self.input] if batch == 1 else [self.input[i] for i in range(batch)]
        self._owned = owned

    def process(self, frames: Sequence[np.ndarray], timings: Sequence[np.ndarray]) -> list[Detections]:
        transforms = []
        for frame, target, timing in zip(frames, self._targets, timings):
            t0 = time.perf_counter()
            transforms.append(self.preprocessor(frame, target))
            timing[_PRE] = time.perf_counter() - t0
        t1 = time.perf_counter()
        outputs = self.session.infer()  # samples past len(frames) hold stale inputs; their outputs are ignored
        infer = time.perf_counter() - t1
        out = []
        for i, (transform, timing) in enumerate(zip(transforms, timings)):
            t2 = time.perf_counter()
            sample = outputs if self.batch == 1 else {name: value[i:i + 1] for name, value in outputs.items()}
            out.append(self.decoder(sample, transform))
            timing[_INFER] = infer
            timing[_POST] = time.perf_counter() - t2
        return out

    def close(self) -> None:
        if self._owned:
            self.session.close()


class CpuProcessor(Processor):
    """``runtime.slots`` session forks (default :func:`~edgert.pipeline.processor.default_slots`).

    ``detector``: use this open Detector's session as the first slot (and fork it for the others) instead
    of opening the model; the detector stays the caller's.
    """

    kind = "cpu"

    def __init__(self, config: PipelineConfig, backend: str, detector: Detector | None = None, batch: int = 1) -> None:
        super().__init__()
        from edgert.vision.detector import Detector
        from edgert.vision.opened import fill_other_inputs

        wanted = slots_wanted(config, "cpu")
        self._owns_detector = detector is None
        if detector is None:
            threads = config.model.threads
            if backend == "onnxruntime" and not threads:
                threads = max(1, (os.cpu_count() or 1) // wanted)
            model = dataclasses.replace(config.model, threads=threads)
            detector = Detector(config.model.path, dataclasses.replace(config, model=model), backend=backend,
                                batch=batch)
        self.detector = detector
        self.batch = int(getattr(detector, "batch", 1))
        self.threads = detector.config.model.threads
        session = detector.session
        self.names = tuple(detector.names)
        self.backend_name = session.backend_name
        self.input_name = detector.input_name
        buf = session.inputs[self.input_name]
        self.input_shape, self.input_dtype = tuple(buf.shape), str(buf.dtype)
        self.decoder_kind = detector.decoder.kind
        try:
            self.slots.append(CpuSlot(session, detector.preprocessor, detector.decoder, self.input_name, owned=False,
                                      batch=self.batch))
            for _ in range(wanted - 1):
                try:
                    fork = session.fork()
                except BackendError as exc:
                    log.info("one slot only: %s", exc)
                    break
                fill_other_inputs(fork, self.input_name, detector.config.model.inputs, str(config.model.path))
                preprocessor = Preprocessor(detector.config.preprocess, detector.preprocessor.spec, fork.metadata)
                decoder = make_decoder(detector.config.decode, detector.output_specs, fork.metadata)
                self.slots.append(CpuSlot(fork, preprocessor, decoder, self.input_name, owned=True, batch=self.batch))
        except BaseException:
            self.close()
            raise

    def warm_up(self, runs: int) -> None:
        for slot in self.slots:
            assert isinstance(slot, CpuSlot)
            for _ in range(max(0, runs)):
                slot.session.infer()

    def describe(self) -> JSONDict:
        return {"kind": self.kind, "slots": len(self.slots), "batch": self.batch, "threads_per_slot": self.threads,
                "decoder": self.decoder_kind}

    def close(self) -> None:
        super().close()
        if self._owns_detector:
            self.detector.close()
