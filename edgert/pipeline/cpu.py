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
from typing import Any

import numpy as np

from edgert.config import PipelineConfig
from edgert.errors import BackendError
from edgert.pipeline.processor import Processor, ProcessorSlot, slots_wanted
from edgert.pipeline.stats import STAGES
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.detections import Detections
from edgert.vision.preprocess import Preprocessor

__all__ = ["CpuProcessor", "CpuSlot"]

log = logging.getLogger(__name__)

_PRE, _INFER, _POST = STAGES.index("preprocess"), STAGES.index("infer"), STAGES.index("postprocess")


class CpuSlot(ProcessorSlot):
    """One session fork with its own preprocessor and decoder."""

    def __init__(self, session: Any, preprocessor: Preprocessor, decoder: Decoder, input_name: str,
                 owned: bool) -> None:
        self.session = session
        self.preprocessor = preprocessor
        self.decoder = decoder
        self.input = session.inputs[input_name]
        self._owned = owned

    def process(self, frame: np.ndarray, timings: np.ndarray) -> Detections:
        t0 = time.perf_counter()
        transform = self.preprocessor(frame, self.input)
        t1 = time.perf_counter()
        outputs = self.session.infer()
        t2 = time.perf_counter()
        detections = self.decoder(outputs, transform)
        timings[_PRE] = t1 - t0
        timings[_INFER] = t2 - t1
        timings[_POST] = time.perf_counter() - t2
        return detections

    def close(self) -> None:
        if self._owned:
            self.session.close()


class CpuProcessor(Processor):
    """``runtime.slots`` session forks (default :func:`~edgert.pipeline.processor.default_slots`).

    ``detector``: use this open Detector's session as the first slot (and fork it for the others) instead
    of opening the model; the detector stays the caller's.
    """

    kind = "cpu"

    def __init__(self, config: PipelineConfig, backend: str, detector: Any = None) -> None:
        super().__init__()
        from edgert.vision.detector import Detector, concrete_output_specs

        wanted = slots_wanted(config, "cpu")
        self._owns_detector = detector is None
        if detector is None:
            threads = config.model.threads
            if backend == "onnxruntime" and not threads:
                threads = max(1, (os.cpu_count() or 1) // wanted)
            model = dataclasses.replace(config.model, threads=threads)
            detector = Detector(config.model.path, dataclasses.replace(config, model=model), backend=backend)
        self.detector = detector
        self.threads = detector.config.model.threads
        session = detector.session
        self.names = tuple(detector.names)
        self.backend_name = session.backend_name
        self.input_name = detector.input_name
        buf = session.inputs[self.input_name]
        self.input_shape, self.input_dtype = tuple(buf.shape), str(buf.dtype)
        self.decoder_kind = detector.decoder.kind
        try:
            self.slots.append(CpuSlot(session, detector.preprocessor, detector.decoder, self.input_name, owned=False))
            for _ in range(wanted - 1):
                try:
                    fork = session.fork()
                except BackendError as exc:
                    log.info("one slot only: %s", exc)
                    break
                preprocessor = Preprocessor(detector.config.preprocess, detector.preprocessor.spec, fork.metadata)
                decoder = make_decoder(detector.config.decode, concrete_output_specs(fork), fork.metadata)
                self.slots.append(CpuSlot(fork, preprocessor, decoder, self.input_name, owned=True))
        except BaseException:
            self.close()
            raise

    def warm_up(self, runs: int) -> None:
        for slot in self.slots:
            assert isinstance(slot, CpuSlot)
            for _ in range(max(0, runs)):
                slot.session.infer()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "slots": len(self.slots), "threads_per_slot": self.threads,
                "decoder": self.decoder_kind}

    def close(self) -> None:
        super().close()
        if self._owns_detector:
            self.detector.close()
