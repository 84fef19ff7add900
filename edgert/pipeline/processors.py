"""Opening the processor a pipeline runs on: the CPU or the GPU implementation of :class:`Processor`.

It lives apart from :mod:`edgert.pipeline.processor` (the interface both implementations import), so the
interface never imports its implementations.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from edgert.config import PipelineConfig
from edgert.errors import ConfigError
from edgert.pipeline.processor import Processor, batched_model, resolve_processing

__all__ = ["open_processor"]

log = logging.getLogger("edgert.pipeline.processor")


def open_processor(config: PipelineConfig, detector: Any = None, batch: int | None = 1, sources: int = 1) -> Processor:
    """The processor ``config`` asks for (see :func:`resolve_processing`), with its slots opened.

    ``batch``: frames per engine call (several sources batched together); None: ``runtime.batch``, else one per
    source on the GPU processor and 1 on the CPU one (a few CPU cores gain nothing from batching and lose
    some: measured on the 2-core CI box, 4 nanodet streams batched ran at 0.56-0.62x one stream, in rotation
    at batch 1 they keep up; on the H200 8 batched streams ran at 2.16x one); a model whose batch is fixed at 1
    is rewritten to a dynamic batch where its graph allows (:func:`batched_model`), else it runs one frame
    per call (``processor.batch_note`` says why). ``detector``: an open
    :class:`~edgert.vision.detector.Detector` whose session the CPU processor forks (benchmarks,
    applications that already hold one); it stays the caller's to close.
    """
    from edgert.speech.stages import SPEECH_TASKS

    if config.task in SPEECH_TASKS:  # the speech chain behind one slot (edgert.pipeline.speech)
        from edgert.pipeline.speech import SpeechProcessor

        return SpeechProcessor(config, sources=sources)
    if detector is not None:
        if config.runtime.processing == "gpu":
            raise ConfigError("runtime.processing: gpu opens its own GPU sessions; pass no detector")
        from edgert.pipeline.cpu import CpuProcessor

        return CpuProcessor(config, detector.session.backend_name, detector=detector)
    backend, processing, why = resolve_processing(config)
    log.info("processing on the %s (%s)", processing.upper(), why)
    if batch is None:
        batch = config.runtime.batch or (sources if processing == "gpu" else 1)
    model, batch, note = batched_model(config.model.path, batch)
    if model != config.model.path:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=model))
    if processing == "gpu":
        from edgert.pipeline.gpu import GpuProcessor

        processor: Processor = GpuProcessor(config, backend, batch=batch)
    else:
        from edgert.pipeline.cpu import CpuProcessor

        processor = CpuProcessor(config, backend, batch=batch)
    processor.batch_note = note
    return processor
