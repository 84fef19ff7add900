"""Which processor a run gets, and opening it: the CPU or the GPU implementation of :class:`Processor`,
with the model made to take a batch where the run batches sources.

It lives apart from :mod:`edgert.pipeline.processor` (the interface both implementations import), so the
interface never imports its implementations nor decides between them.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from edgert.config import PipelineConfig
from edgert.errors import ConfigError
from edgert.pipeline.processor import Processor

if TYPE_CHECKING:
    from edgert.vision.detector import Detector

__all__ = ["GPU_ONLY_KEYS", "batched_model", "open_processor", "resolve_processing"]

log = logging.getLogger(__name__)


#: runtime keys that only the GPU processor reads, with the flag that sets each.
GPU_ONLY_KEYS: dict[str, str] = {"memory": "--memory", "cuda_graph": "--cuda-graph", "part_batches": "--fixed-batch"}


def _gpu_usable(backend: str) -> tuple[bool, str]:
    from edgert.backends import get_backend, gpu_backends

    if backend not in gpu_backends():
        return False, f"backend {backend} runs on the CPU (GPU processing needs one of {', '.join(gpu_backends())})"

    try:
        get_backend(backend)
    except ConfigError:
        raise
    except Exception as exc:  # BackendUnavailable and friends: say why, in one line
        return False, str(exc)
    from edgert.backends.cuda import check_available

    try:
        check_available()
    except Exception as exc:
        return False, str(exc)
    return True, f"backend {backend} runs on the GPU"


def resolve_processing(config: PipelineConfig) -> tuple[str, str, str]:
    """(backend, processing, why) for ``config``: the backend ``auto`` picks, and ``cpu`` or ``gpu``.

    Raises :class:`ConfigError` for ``processing: gpu`` where no GPU can be used, and for GPU-only keys
    (``runtime.memory``, ``runtime.cuda_graph``) on a run that uses the CPU processor.
    """
    from edgert.backends import choose_backend, gpu_backends

    backend = config.model.backend
    probes_note = ""
    if backend == "auto":
        backend, probes = choose_backend()
        passed = [f"{p.name}: {p.reason}" for p in probes if not p.available and p.name in gpu_backends()]
        probes_note = f" ({'; '.join(passed)})" if passed else ""
    if config.runtime.cuda_graph and backend in gpu_backends():
        from edgert.backends import backend_class

        if not backend_class(backend).cuda_graphs:
            able = [name for name in gpu_backends() if backend_class(name).cuda_graphs]
            raise ConfigError(f"runtime.cuda_graph (--cuda-graph): the {backend} backend does not capture CUDA graphs "
                              f"(edgert's {backend} sessions enqueue each call). Note: drop it, or use --backend "
                              f"{' or '.join(able)}")
    requested = config.runtime.processing
    if requested == "cpu":
        processing, why = "cpu", "runtime.processing: cpu"
    else:
        ok, why = _gpu_usable(backend)
        if requested == "gpu" and not ok:
            raise ConfigError(f"runtime.processing: gpu: no usable GPU: {why}{probes_note}")
        processing = "gpu" if ok else "cpu"
    if processing == "cpu":
        for key, flag in GPU_ONLY_KEYS.items():
            if getattr(config.runtime, key) is not None:
                raise ConfigError(f"runtime.{key} ({flag}) applies to GPU processing only; this run uses the CPU "
                                  f"processor: {why}. Note: drop it, or set runtime.processing: gpu")
    return backend, processing, why


def batched_model(path: str, batch: int) -> tuple[str, int, str | None]:
    """(model path, batch, note): the model to open for ``batch`` frames per call.

    A model with a dynamic batch dimension (or an engine, whose optimisation profile decides) is used as it
    is; an ONNX model fixed at batch 1 is rewritten (checked, cached: :mod:`edgert.rewrite.batch`) or, where
    that cannot be done, runs at batch 1 and the note says why.
    """
    if batch <= 1 or not path.lower().endswith(".onnx"):
        return path, batch, None
    from edgert.onnx_file import read_onnx

    graph = read_onnx(path, weights=False).graph
    initializers = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    dims = [i.type.tensor_type.shape.dim for i in inputs]
    if all(d and (d[0].dim_param or d[0].dim_value <= 0) for d in dims):
        return path, batch, None  # already dynamic
    if all(d and d[0].dim_value == batch for d in dims):
        return path, batch, None
    from edgert.errors import ModelError
    from edgert.rewrite.batch import batched_model_path

    try:
        return str(batched_model_path(path)), batch, None
    except ModelError as exc:
        note = f"{exc}; sources run in rotation without batching"
        log.warning("%s", note)
        return path, 1, note


def open_processor(config: PipelineConfig, detector: Detector | None = None, batch: int | None = 1,
                   sources: int = 1) -> Processor:
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
    from edgert.tasks import SPEECH_TASKS

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
    from edgert.backends import builds_engines

    model, batch, note = batched_model(config.model.path, batch)
    if model != config.model.path and builds_engines(backend) and not Path(model).with_suffix(".engine").exists():
        # The dynamic-batch model lives in edgert's cache, so the build command to name is the user's model's.
        raise ConfigError(f"{config.model.path}: no {backend} engine for {batch} frames a call yet (engines are "
                          f"never built while serving); run: edgert build {config.model.path} --backend {backend} "
                          f"--batch {batch}")
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
