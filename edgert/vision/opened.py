"""Opening a detection model: the one room where a session, its preprocessing, its decoder and its batch
are put together, for :class:`~edgert.vision.detector.Detector`, the CPU processor and the GPU processor.

:func:`open_model` opens the session (or takes an open one), finds the image input, builds the
letterbox for it, reopens a model with a dynamic image size or batch at the size the preprocessing
resolved, fills the other inputs with their configured constants, and makes the decoder from the output
specs (per sample when several frames go in one call). A GPU caller asks for a session whose buffers are on
the device (``gpu=True``); a backend whose sessions are not is refused in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgert.backends import SessionOptions, open_session
from edgert.backends.base import Session
from edgert.config import PipelineConfig
from edgert.errors import ConfigError, ModelError
from edgert.types import TensorSpec
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.preprocess import Preprocessor

__all__ = [
    "OpenedModel",
    "concrete_output_specs",
    "fill_other_inputs",
    "image_input",
    "open_model",
    "sample_output_specs",
]


def image_input(session: Session) -> TensorSpec:
    """The model's image input: its only input, or the only rank-4 one."""
    specs = session.input_specs
    if len(specs) == 1:
        return specs[0]
    rank4 = [s for s in specs if len(s.shape) == 4]
    if len(rank4) == 1:
        return rank4[0]
    inputs = ", ".join(s.describe() for s in specs)
    raise ModelError(f"cannot tell which input takes the image: {inputs}. Note: edgert expects one image input")


def fill_other_inputs(session: Session, image: str, values: Mapping[str, Sequence[float]], model: str) -> None:
    """Write the configured constant into every input but the image, once (nothing overwrites them later).

    An input the pipeline cannot fill would otherwise run on zeros and give quietly wrong results (an
    ``orig_target_sizes`` of 0x0, a ``scale_factor`` of 0), so one without a value is an error naming it.
    """
    names = [s.name for s in session.input_specs]
    for name in values:
        if name == image:
            raise ModelError(f"{model}: model.inputs.{name}: that is the image input, which the frames fill")
        if name not in names:
            raise ModelError(f"{model}: model.inputs.{name}: the model has no such input (inputs: {', '.join(names)})")
    for spec in session.input_specs:
        if spec.name == image:
            continue
        if spec.name not in values:
            raise ModelError(
                f"{model}: input {spec.describe()} is not the image and edgert cannot fill it. "
                f"Note: give it a constant with model.inputs in the config: model: {{inputs: {{{spec.name}: [...]}}}}"
            )
        buf = session.inputs[spec.name]
        try:
            np.copyto(buf, np.broadcast_to(np.asarray(values[spec.name], dtype=np.float64), buf.shape),
                      casting="unsafe")
        except ValueError:
            raise ModelError(f"{model}: model.inputs.{spec.name}: {len(values[spec.name])} values do not fit "
                             f"the input's shape {list(buf.shape)}") from None


def concrete_output_specs(session: Session) -> list[TensorSpec]:
    """Output specs with dynamic dims filled in from the session's allocated output buffers."""
    specs = []
    for spec in session.output_specs:
        buf = session.outputs.get(spec.name)
        if buf is None or buf.ndim != len(spec.shape):
            specs.append(spec)
            continue
        shape = tuple(d if isinstance(d, int) and d >= 0 else int(n) for d, n in zip(spec.shape, buf.shape))
        specs.append(TensorSpec(spec.name, shape, spec.dtype))
    return specs


def sample_output_specs(session: Session) -> list[TensorSpec]:
    """Concrete output specs of one sample of a batched session (batch dimension 1): what a decoder sees."""
    return [TensorSpec(s.name, (1, *s.shape[1:]), s.dtype) for s in concrete_output_specs(session)]


@dataclass
class OpenedModel:
    """A model ready for frames: ``session`` (the caller's to close when it opened it here), its image
    input, the ``preprocessor`` that fills it, the ``decoder`` of its outputs and the class ``names``."""

    session: Session
    input_name: str
    preprocessor: Preprocessor
    output_specs: list[TensorSpec]  # what the decoder sees: one sample's when batch > 1
    decoder: Decoder
    names: tuple[str, ...]
    batch: int
    device: Any = None  # the CUDA device of a GPU session


def open_model(config: PipelineConfig, backend: str, path: str | Path | None = None, *,
               session: Session | None = None, batch: int = 1, options: SessionOptions | None = None,
               gpu: bool = False) -> OpenedModel:
    """The model at ``path`` (default ``config.model.path``) opened on ``backend`` for ``batch`` frames a
    call, or ``session`` already open (then it stays the caller's, and a buffer of the wrong size is an error).

    ``options``: the session's options (threads, device, CUDA graphs); the input shape is set here. ``gpu``:
    the session must keep its buffers on a CUDA device (the GPU processor's).
    """
    model = str(path if path is not None else config.model.path)
    options = options or SessionOptions(threads=config.model.threads)
    owned = session is None
    if session is None:
        session = _checked(open_session(model, backend, options), backend, gpu)
    preprocessor: Preprocessor | None = None
    try:
        spec = image_input(session)
        preprocessor = Preprocessor(config.preprocess, spec, session.metadata)
        wanted = preprocessor.input_shape if batch == 1 else (batch, *preprocessor.sample_shape)
        if tuple(session.inputs[spec.name].shape) != tuple(wanted):
            if not owned:
                raise ModelError(
                    f"the session's input buffer {spec.name} is {list(session.inputs[spec.name].shape)} but the "
                    f"preprocessing needs {list(preprocessor.input_shape)}. "
                    f"Note: open the session with SessionOptions(shapes={{'{spec.name}': ...}})"
                )
            # A model with a dynamic image size or batch: reopen at the size the preprocessing resolved.
            session.close()
            session = _checked(open_session(model, backend, dataclasses.replace(options, shapes={spec.name: wanted})),
                               backend, gpu)
        if gpu and session.inputs[spec.name].shape[0] != batch:
            shape = list(session.inputs[spec.name].shape)
            raise ModelError(f"GPU processing of {batch} frame(s) per call cannot use the model input {shape}")
        fill_other_inputs(session, spec.name, config.model.inputs, model)
        output_specs = sample_output_specs(session) if batch > 1 or gpu else concrete_output_specs(session)
        decoder = make_decoder(config.decode, output_specs, session.metadata)
    except MemoryError:
        if owned:
            session.close()
        size = str(list(preprocessor.input_shape)) if preprocessor is not None else "?"
        raise ModelError(f"{model}: not enough memory for the buffers of a {size} input. "
                         "Note: set a smaller preprocess.size") from None
    except BaseException:
        if owned:
            session.close()
        raise
    return OpenedModel(session, spec.name, preprocessor, output_specs, decoder, tuple(decoder.names), batch,
                       getattr(session, "device", None) if gpu else None)


def _checked(session: Session, backend: str, gpu: bool) -> Session:
    """``session``, when it is what the caller runs on; else closed, and refused in one line."""
    if not gpu:
        return session
    from edgert.backends.gpu_session import GpuSession

    if isinstance(session, GpuSession):
        return session
    session.close()
    from edgert.backends import gpu_backends

    raise ConfigError(f"runtime.processing: gpu: backend {backend} keeps its buffers on the host; GPU "
                      f"processing needs one of {', '.join(gpu_backends())}")
