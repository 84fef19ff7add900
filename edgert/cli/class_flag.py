"""``edgert run --classes person,car`` (or ids, ``0,2``): which classes to keep, as ``decode.classes`` ids.

Names are looked up in the class names the run will use: ``decode.names``, else the model's own metadata
(an Ultralytics export's ``names``), else COCO's 80 (what edgert assumes for an 80-class model without names).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edgert.errors import ConfigError

__all__ = ["class_ids", "model_class_names"]


def model_class_names(model: str, configured: Sequence[str] | None) -> tuple[str, ...]:
    """The names a run of ``model`` will give its classes (see the module doc)."""
    if configured:
        return tuple(configured)
    if model and Path(model).suffix.lower() == ".onnx" and Path(model).is_file():
        from edgert.onnx_file import read_onnx
        from edgert.vision.decoders import parse_names

        meta = {p.key: p.value for p in read_onnx(model, weights=False).metadata_props}
        names = parse_names(meta.get("names"))
        if names:
            return names
    from edgert.coco import COCO_NAMES

    return tuple(COCO_NAMES)


def class_ids(text: str, names: Sequence[str]) -> tuple[int, ...]:
    """``person,car`` or ``0,2`` (or both mixed) -> class ids; an unknown name is a one-line error."""
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if not wanted:
        raise ConfigError("--classes: give class names or ids, e.g. --classes person,car")
    lookup = {name.lower(): i for i, name in enumerate(names)}
    ids: list[int] = []
    for part in wanted:
        if part.isdigit():
            ids.append(int(part))
        elif part.lower() in lookup:
            ids.append(lookup[part.lower()])
        else:
            close = [n for n in names if n.lower().startswith(part.lower()[:3])][:5]
            hint = f"; close: {', '.join(close)}" if close else f"; the model's classes start {', '.join(names[:5])}"
            raise ConfigError(f"--classes: no class named {part!r}{hint}")
    return tuple(dict.fromkeys(ids))
