"""Decoding one image file, bounded and by bytes: the one way edgert reads an image from disk.

Two hazards of image folders from the field (an SD card, a Windows share, an upload):

- **Image bombs.** A 1 MB PNG of 32000x32000 pixels decodes to 3 GB of BGR (OpenCV's own limit is 2^30 pixels,
  and its PNG decoder holds more than one copy): the OOM killer on an 8 GB Jetson. The size is read from the
  file's header (PNG, JPEG, BMP, WebP, TIFF, PNM) before anything is decoded and checked against a pixel
  budget: :data:`DEFAULT_MAX_PIXELS` (100 Mpx, 300 MB of BGR: a 8K frame is 33 Mpx), raised or lowered with
  the ``EDGERT_MAX_IMAGE_PIXELS`` environment variable (a service sets it in its EnvironmentFile).
- **Names that are not UTF-8.** ``os.listdir`` returns them with surrogate escapes (``\\udce9`` for Latin-1
  ``é``); OpenCV's ``imread`` is handed a ``str`` it cannot encode (a crash in C). The file is opened by Python
  (which encodes the name back to its bytes) and decoded from memory with ``cv2.imdecode``.

A file that is missing, unreadable, too large or not an image raises :class:`ImageSkipped` with the reason:
callers count it as a skip (a folder) or make it a one-line error (a lone image).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from edgert._lazy import lazy_import
from edgert.errors import InputError

__all__ = ["DEFAULT_MAX_PIXELS", "ENV_MAX_PIXELS", "ImageSkipped", "ImageTooLarge", "decode_image_file",
           "image_size", "max_pixels"]

#: 100 Mpx: 300 MB of BGR at most per decoded image, a few of which fit beside a model on an 8 GB board.
DEFAULT_MAX_PIXELS = 100_000_000
ENV_MAX_PIXELS = "EDGERT_MAX_IMAGE_PIXELS"
_HEAD = 64 * 1024  # most headers fit in far less
_JPEG_HEAD = 4 << 20  # a JPEG's SOF may follow EXIF thumbnails and an ICC profile split over segments


class ImageSkipped(InputError):
    """An image file that is not decoded; ``reason`` says why in a few words."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason


class ImageTooLarge(ImageSkipped):
    """An image whose header gives more pixels than the budget."""


def max_pixels() -> int:
    """The pixel budget of one decode: ``EDGERT_MAX_IMAGE_PIXELS`` when set, else :data:`DEFAULT_MAX_PIXELS`."""
    text = os.environ.get(ENV_MAX_PIXELS, "").strip()
    if not text:
        return DEFAULT_MAX_PIXELS
    try:
        value = int(float(text))
    except ValueError:
        raise InputError(f"{ENV_MAX_PIXELS}={text!r}: expected a number of pixels, e.g. 200000000") from None
    if value < 1:
        raise InputError(f"{ENV_MAX_PIXELS}={text!r}: expected a positive number of pixels")
    return value


def _jpeg(head: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 < len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        length = struct.unpack(">H", head[i + 2:i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            height, width = struct.unpack(">HH", head[i + 5:i + 9])
            return width, height
        i += 2 + length
    return None


def _tiff(head: bytes) -> tuple[int, int] | None:
    order = "<" if head[:2] == b"II" else ">"
    (offset,) = struct.unpack(order + "I", head[4:8])
    if offset + 2 > len(head):
        return None
    (count,) = struct.unpack(order + "H", head[offset:offset + 2])
    found: dict[int, int] = {}
    for k in range(count):
        at = offset + 2 + 12 * k
        if at + 12 > len(head):
            break
        tag, kind = struct.unpack(order + "HH", head[at:at + 4])
        if tag in (256, 257):
            short = kind == 3
            found[tag] = struct.unpack(order + ("H" if short else "I"), head[at + 8:at + (10 if short else 12)])[0]
    return (found[256], found[257]) if 256 in found and 257 in found else None


def _pnm(head: bytes) -> tuple[int, int] | None:
    words: list[bytes] = []
    for line in head[2:].split(b"\n"):
        words += line.split(b"#", 1)[0].split()
        if len(words) >= 2:
            return int(words[0]), int(words[1])
    return None


def image_size(head: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the first bytes of an image file, or None when the format is not one known here."""
    try:
        if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
            w, h = struct.unpack(">II", head[16:24])
            return int(w), int(h)
        if head[:2] == b"\xff\xd8":
            return _jpeg(head)
        if head[:2] == b"BM":
            w, h = struct.unpack("<ii", head[18:26])
            return abs(w), abs(h)
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            chunk = head[12:16]
            if chunk == b"VP8X":
                w = int.from_bytes(head[24:27], "little") + 1
                h = int.from_bytes(head[27:30], "little") + 1
                return w, h
            if chunk == b"VP8L":
                bits = int.from_bytes(head[21:25], "little")
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", head[26:30])
                return w & 0x3FFF, h & 0x3FFF
        if head[:4] in (b"II*\x00", b"MM\x00*"):
            return _tiff(head)
        if head[:1] == b"P" and head[1:2] in b"123456":
            return _pnm(head)
    except (struct.error, ValueError, KeyError, IndexError):
        return None
    return None


def decode_image_file(path: str | Path, budget: int | None = None) -> np.ndarray:
    """The BGR image at ``path``, decoded from its bytes; :class:`ImageSkipped` (or :class:`ImageTooLarge`, from
    the header, before decoding) when it cannot or must not be decoded."""
    cv2 = lazy_import("cv2", "reading images")
    limit = max_pixels() if budget is None else budget
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
            size = image_size(head)
            if size is None and head[:2] == b"\xff\xd8":  # a JPEG's SOF past large EXIF/ICC segments
                head += f.read(_JPEG_HEAD - len(head))
                size = image_size(head)
            if size is None:
                raise ImageSkipped(path, "not an image of a known format (PNG, JPEG, BMP, WebP, TIFF, PNM)")
            width, height = size
            if width * height > limit:
                raise ImageTooLarge(path, f"{width}x{height} is {width * height / 1e6:.0f} Mpx, over the budget of "
                                          f"{limit / 1e6:.0f} Mpx (raise it with {ENV_MAX_PIXELS})")
            data = head + f.read()
    except OSError as exc:
        raise ImageSkipped(path, f"cannot read it: {exc.strerror or exc}") from None
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) if data else None
    except cv2.error as exc:
        raise ImageSkipped(path, f"cannot decode it: {str(exc).strip().splitlines()[-1]}") from None
    if image is None or image.ndim != 3 or not image.shape[0] or not image.shape[1]:
        raise ImageSkipped(path, "cannot decode it (damaged or unsupported format)")
    return np.ascontiguousarray(image)
