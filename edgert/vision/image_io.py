"""Reading and writing single image files through OpenCV, with one-line errors.

Writes are atomic: the image is encoded in memory, written to a temporary name in the same folder and
renamed over the target, so a reader (a web server, a file watcher) never sees half a JPEG.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgert._lazy import lazy_import
from edgert.atomic_file import replace_file
from edgert.errors import InputError
from edgert.image_file import decode_image_file

__all__ = ["IMAGE_WRITE_SUFFIXES", "encode_image", "read_image", "write_image"]

#: Formats the OpenCV pip wheel writes (by suffix).
IMAGE_WRITE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})

JPEG_QUALITY = 90


def read_image(path: str | Path) -> np.ndarray:
    """The BGR image at ``path``; :class:`InputError` when it is missing or not an image."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"{p}: image file not found")
    return decode_image_file(p)  # bounded by the pixel budget; the name may be any bytes


def encode_image(image: np.ndarray, suffix: str) -> bytes:
    """``image`` encoded in the format of ``suffix`` (``.jpg``, ``.png``, ...)."""
    cv2 = lazy_import("cv2", "writing images")
    suffix = suffix.lower()
    if suffix not in IMAGE_WRITE_SUFFIXES:
        raise InputError(f"cannot write images as {suffix or 'a file without a suffix'}. "
                         f"Note: use one of {', '.join(sorted(IMAGE_WRITE_SUFFIXES))}")
    params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY] if suffix in (".jpg", ".jpeg") else []
    ok, buf = cv2.imencode(suffix, image, params)
    if not ok:
        raise InputError(f"OpenCV could not encode a {image.shape} image as {suffix}")
    return bytes(buf)


def write_image(path: str | Path, image: np.ndarray) -> Path:
    """Write ``image`` to ``path`` atomically (temporary file + rename, readable by others); returns the path."""
    p = Path(path).expanduser()
    data = encode_image(image, p.suffix)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        replace_file(p, data)
    except OSError as exc:
        raise InputError(f"{p}: cannot write the image: {exc.strerror or exc}") from None
    return p
