"""``Detector``: one model, one frame in, :class:`Detections` out.

The convenience API for applications, calibration comparisons and tests. The model is opened by
:func:`edgert.vision.opened.open_model`, as for the pipeline's processors, which use the same three parts
(``session``, ``preprocessor``, ``decoder``) on separate threads.

    with Detector("yolov8n.onnx") as det:
        found = det("street.jpg")          # a path, or a BGR array (cv2.imread, a video frame)
        for box, name in zip(found.xyxy, found.class_names()): ...
        found.save("street-boxes.jpg")     # found.plot(): the annotated copy as an array
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

import numpy as np

from edgert.backends.base import Session
from edgert.config import PipelineConfig
from edgert.vision.decoders import Decoder
from edgert.vision.detections import Detections
from edgert.vision.image_io import read_image
from edgert.vision.opened import open_model
from edgert.vision.preprocess import LetterboxTransform

__all__ = ["Detector"]


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
        if session is None and backend == "auto" and self.config.model.backend != "auto":
            backend = self.config.model.backend
        ready = open_model(self.config, backend, model, session=session, batch=batch)
        self.session = ready.session
        self.input_name = ready.input_name
        self.preprocessor = ready.preprocessor
        self.output_specs = ready.output_specs
        self.decoder: Decoder = ready.decoder
        self.names = ready.names

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
