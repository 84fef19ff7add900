"""``Detector``: one model, one frame in, :class:`Detections` out.

The convenience API for applications, calibration comparisons and tests. The streaming pipeline uses
the same three parts (``session``, ``preprocessor``, ``decoder``) on separate threads.

    with Detector("yolov8n.onnx") as det:
        found = det("street.jpg")          # a path, or a BGR array (cv2.imread, a video frame)
        for box, name in zip(found.xyxy, found.class_names()): ...
        found.save("street-boxes.jpg")     # found.plot(): the annotated copy as an array
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np

from edgert.backends import SessionOptions, open_session
from edgert.backends.base import Session
from edgert.config import PipelineConfig
from edgert.errors import ModelError
from edgert.types import TensorSpec
from edgert.vision.decoders import Decoder, make_decoder
from edgert.vision.detections import Detections
from edgert.vision.image_io import read_image
from edgert.vision.preprocess import LetterboxTransform, Preprocessor

__all__ = ["Detector", "concrete_output_specs", "fill_other_inputs", "image_input", "sample_output_specs"]


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


class Detector:
    """Open ``model`` on ``backend`` (or use an open ``session``) and detect objects in BGR frames."""

    def __init__(
        self,
        model: str | Path,
        config: PipelineConfig | None = None,
        backend: str = "auto",
        session: Session | None = None,
        batch: int = 1,
    ) -> None:
        """``batch`` > 1 opens the session for that many frames per call (a model with a dynamic batch);
        the pipeline fills and decodes the samples itself, ``__call__`` uses the first."""
        self.config = config or PipelineConfig()
        self.batch = batch
        self._owns_session = session is None
        if session is None:
            if backend == "auto" and self.config.model.backend != "auto":
                backend = self.config.model.backend
            session = open_session(model, backend, SessionOptions(threads=self.config.model.threads))
        try:
            spec = image_input(session)
            self.preprocessor = Preprocessor(self.config.preprocess, spec, session.metadata)
            wanted = self.preprocessor.input_shape if batch == 1 else (batch, *self.preprocessor.sample_shape)
            if session.inputs[spec.name].shape != wanted:
                if not self._owns_session:
                    raise ModelError(
                        f"the session's input buffer {spec.name} is {list(session.inputs[spec.name].shape)} but the "
                        f"preprocessing needs {list(self.preprocessor.input_shape)}. "
                        f"Note: open the session with SessionOptions(shapes={{'{spec.name}': ...}})"
                    )
                # A model with a dynamic image size: reopen with the size the preprocessing resolved.
                session.close()
                shapes = {spec.name: wanted}
                session = open_session(model, backend, SessionOptions(threads=self.config.model.threads, shapes=shapes))
            self.input_name = spec.name
            fill_other_inputs(session, spec.name, self.config.model.inputs, str(model))
            self.output_specs = sample_output_specs(session) if batch > 1 else concrete_output_specs(session)
            self.decoder: Decoder = make_decoder(self.config.decode, self.output_specs, session.metadata)
        except MemoryError:
            if self._owns_session:
                session.close()
            shape = list(self.preprocessor.input_shape) if hasattr(self, "preprocessor") else "?"
            raise ModelError(f"{model}: not enough memory for the buffers of a {shape} input. "
                             "Note: set a smaller preprocess.size") from None
        except BaseException:
            if self._owns_session:
                session.close()
            raise
        self.session = session
        self.names = self.decoder.names

    def preprocess(self, frame_bgr: np.ndarray) -> LetterboxTransform:
        """Write ``frame_bgr`` into the session's input buffer."""
        buf = self.session.inputs[self.input_name]
        return self.preprocessor(frame_bgr, buf if self.batch == 1 else buf[0])

    def __call__(self, image: np.ndarray | str | Path) -> Detections:
        """Detect objects in a BGR frame or an image file; the result keeps the frame for ``plot``/``save``."""
        frame = read_image(image) if isinstance(image, (str, Path)) else image
        transform = self.preprocess(frame)
        outputs = self.session.infer()
        if self.batch > 1:
            outputs = {name: value[:1] for name, value in outputs.items()}
        found = self.decoder(outputs, transform)
        return Detections(found.xyxy, found.confidence, found.class_id, found.names, image=frame)

    def close(self) -> None:
        if self._owns_session:
            self.session.close()

    def __enter__(self) -> Detector:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
