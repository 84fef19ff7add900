"""``Detections``: the one result type of a detector, numpy inside, validated when built."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgert.errors import InputError

__all__ = ["Detections"]


def _as(array: Any, dtype: type[np.generic], name: str) -> np.ndarray:
    try:
        out = np.asarray(array)
    except (TypeError, ValueError) as exc:
        raise InputError(f"Detections.{name}: cannot make an array: {exc}") from None
    if out.dtype != dtype:
        # Integers of any width and floats of any precision coerce; strings and objects do not.
        if out.size and out.dtype.kind not in "biuf":
            raise InputError(f"Detections.{name} | Received dtype {out.dtype}. Note: expected numbers")
        out = out.astype(dtype)
    return out


def _same_tracks(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(a, b))


@dataclass(frozen=True, eq=False)
class Detections:
    """Boxes found in one frame.

    ``xyxy`` is (N, 4) float32 in original-frame pixels (x1, y1, x2, y2), ``confidence`` (N,) float32,
    ``class_id`` (N,) int32; ``names`` is the model's class-name table (may be empty: ids then name
    themselves). ``track_id`` (N,) int64 is set by a tracker (:mod:`edgert.analytics.tracking`) and None
    before one ran (-1: a detection no track claims). Arrays are coerced to those dtypes; shapes that
    disagree raise :class:`InputError`.

    ``image`` is the BGR frame the boxes were found in, when the caller kept it (``Detector`` on a path or
    an array does): ``plot()`` draws on a copy of it and ``save(path)`` writes that copy.
    """

    xyxy: np.ndarray
    confidence: np.ndarray
    class_id: np.ndarray
    names: tuple[str, ...] = ()
    track_id: np.ndarray | None = None
    image: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        xyxy = _as(self.xyxy, np.float32, "xyxy")
        if xyxy.size == 0:
            xyxy = xyxy.reshape(0, 4)
        if xyxy.ndim != 2 or xyxy.shape[1] != 4:
            raise InputError(f"Detections.xyxy | Received shape {xyxy.shape}. Note: expected (N, 4)")
        n = xyxy.shape[0]
        confidence = _as(self.confidence, np.float32, "confidence").reshape(-1)
        class_id = _as(self.class_id, np.int32, "class_id").reshape(-1)
        if confidence.shape[0] != n or class_id.shape[0] != n:
            raise InputError(
                f"Detections: {n} boxes but {confidence.shape[0]} confidences and {class_id.shape[0]} class ids"
            )
        # frozen: assign through object.__setattr__ so the stored arrays are the coerced ones
        object.__setattr__(self, "xyxy", xyxy)
        object.__setattr__(self, "confidence", confidence)
        object.__setattr__(self, "class_id", class_id)
        object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        if self.track_id is not None:
            track_id = _as(self.track_id, np.int64, "track_id").reshape(-1)
            if track_id.shape[0] != n:
                raise InputError(f"Detections: {n} boxes but {track_id.shape[0]} track ids")
            object.__setattr__(self, "track_id", track_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Detections):
            return NotImplemented
        return (
            self.names == other.names
            and np.array_equal(self.xyxy, other.xyxy)
            and np.array_equal(self.confidence, other.confidence)
            and np.array_equal(self.class_id, other.class_id)
            and _same_tracks(self.track_id, other.track_id)
        )

    __hash__ = None  # type: ignore[assignment]  # arrays inside: not hashable

    def __len__(self) -> int:
        return int(self.xyxy.shape[0])

    @classmethod
    def trusted(cls, xyxy: np.ndarray, confidence: np.ndarray, class_id: np.ndarray,
                names: tuple[str, ...]) -> Detections:
        """Detections from arrays a decoder made itself: (N, 4) float32, (N,) float32, (N,) int32, and a tuple
        of str, taken as they are (no coercion, no checks). The result path builds one per frame, so the
        checks' dozen calls (and ``str`` over every class name) are not paid per frame."""
        out = object.__new__(cls)
        object.__setattr__(out, "xyxy", xyxy)
        object.__setattr__(out, "confidence", confidence)
        object.__setattr__(out, "class_id", class_id)
        object.__setattr__(out, "names", names)
        object.__setattr__(out, "track_id", None)
        object.__setattr__(out, "image", None)
        return out

    @classmethod
    def empty(cls, names: Sequence[str] = ()) -> Detections:
        return cls(np.zeros((0, 4), np.float32), np.zeros((0,), np.float32), np.zeros((0,), np.int32), tuple(names))

    def class_name(self, class_id: int) -> str:
        """The name of ``class_id`` from the table, or the id itself when the table lacks it."""
        i = int(class_id)
        return self.names[i] if 0 <= i < len(self.names) else str(i)

    def class_names(self) -> list[str]:
        return [self.class_name(i) for i in self.class_id.tolist()]

    def __getitem__(self, index: Any) -> Detections:
        """A subset: ``det[det.confidence > 0.5]``, ``det[:3]``, ``det[[0, 2]]``."""
        if isinstance(index, (int, np.integer)):
            index = [int(index)]
        track_id = None if self.track_id is None else self.track_id[index]
        return Detections(self.xyxy[index], self.confidence[index], self.class_id[index], self.names, track_id,
                          self.image)

    def with_track_id(self, track_id: Any) -> Detections:
        """The same boxes with ``track_id`` set (one int per box)."""
        return Detections(self.xyxy, self.confidence, self.class_id, self.names, track_id, self.image)
    def plot(self, image: np.ndarray | None = None, labels: bool = True) -> np.ndarray:
        """An annotated copy of ``image`` (default: the frame these detections came from); needs OpenCV."""
        frame = self.image if image is None else image
        if frame is None:
            raise InputError("Detections.plot: no image to draw on. Note: pass plot(frame), or call the Detector "
                             "on the image itself")
        from edgert.vision.draw import draw_detections  # OpenCV is loaded only when a frame is drawn

        return draw_detections(np.array(frame, dtype=np.uint8, copy=True), self, labels=labels)

    def save(self, path: str | Path, image: np.ndarray | None = None) -> Path:
        """Write :meth:`plot` to ``path`` (the suffix picks the format: .jpg, .png, ...); returns the path."""
        from edgert.vision.image_io import write_image

        return write_image(path, self.plot(image))

    def counts(self) -> dict[str, int]:
        """Detections per class name (for summaries)."""
        out: dict[str, int] = {}
        for name in self.class_names():
            out[name] = out.get(name, 0) + 1
        return out

    def to_supervision(self) -> Any:
        """These boxes as a ``supervision.Detections`` (for its annotators, ``LineZone``, ``PolygonZone``):
        ``xyxy``, ``confidence``, ``class_id``, ``tracker_id`` (None before tracking) and the class names in
        ``data["class_name"]``. supervision is imported here only (``pip install supervision``)."""
        from edgert._lazy import lazy_import

        sv = lazy_import("supervision", "Detections.to_supervision")
        return sv.Detections(
            xyxy=self.xyxy.astype(np.float32, copy=True),
            confidence=self.confidence.copy(),
            class_id=self.class_id.astype(int),
            tracker_id=None if self.track_id is None else self.track_id.astype(int),
            data={"class_name": np.array(self.class_names(), dtype=str)},
        )

    @classmethod
    def from_supervision(cls, detections: Any, names: Sequence[str] = (),
                         image: np.ndarray | None = None) -> Detections:
        """Detections from a ``supervision.Detections``; missing confidences are 1.0, missing class ids 0,
        ``tracker_id`` becomes ``track_id``. ``names`` is the class-name table (supervision keeps none)."""
        xyxy = np.asarray(getattr(detections, "xyxy", None) if detections is not None else None)
        if xyxy.dtype == object or xyxy.ndim == 0:
            raise InputError("Detections.from_supervision: expected a supervision.Detections (with xyxy), got "
                             f"{type(detections).__name__}")
        n = int(xyxy.reshape(-1, 4).shape[0]) if xyxy.size else 0
        confidence = detections.confidence
        class_id = detections.class_id
        return cls(xyxy.reshape(n, 4),
                   np.ones(n, np.float32) if confidence is None else confidence,
                   np.zeros(n, np.int32) if class_id is None else class_id,
                   tuple(names), getattr(detections, "tracker_id", None), image)

    def to_records(self) -> list[dict[str, Any]]:
        """JSON-ready dicts: box rounded to 0.1 px, confidence to 4 decimals; ``track_id`` once tracked."""
        boxes = np.round(self.xyxy.astype(np.float64), 1).tolist()
        confs = np.round(self.confidence.astype(np.float64), 4).tolist()
        ids = self.class_id.tolist()
        records: list[dict[str, Any]] = [
            {"box": box, "confidence": conf, "class_id": cid, "class_name": self.class_name(cid)}
            for box, conf, cid in zip(boxes, confs, ids)
        ]
        if self.track_id is not None:
            for record, tid in zip(records, self.track_id.tolist()):
                record["track_id"] = tid
        return records

    def __repr__(self) -> str:
        return f"Detections({len(self)} boxes: {self.counts()})"
