"""Copies of calibration images: mirrored, at half size, tiled in mosaics, degraded as compressed video.

The check set of the mixed-precision pass (:func:`edgert.calib.check.check_frames`) adds them to the
calibration images so a layer is judged on scenes it did not get its ranges from (small objects and crowded
frames, as a street camera sees them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from edgert._lazy import lazy_import
from edgert.errors import CalibrationError

__all__ = ["VARIANTS", "degraded", "known_variants", "mosaic", "small", "variant_copies"]

#: The copies of each image a variant name adds, and what each says in the report.
VARIANTS = {
    "mirror": "mirror images",
    "half": "half-size copies",
    "mosaic": "2x2 mosaics",
    "mosaic3": "3x3 mosaics",
    "lowq": "low-quality copies (half resolution and back, JPEG 40)",
}


def known_variants(variants: Sequence[str], what: str = "image variant") -> None:
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise CalibrationError(f"unknown {what}(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")


def variant_copies(chosen: Sequence[np.ndarray], variant: str) -> Iterator[np.ndarray]:
    """One copy of each of ``chosen`` per ``variant`` (a name of :data:`VARIANTS`), in ``chosen``'s order."""
    for i, img in enumerate(chosen):
        if variant == "mirror":
            yield np.ascontiguousarray(img[:, ::-1])
        elif variant == "half":
            yield small(img)
        elif variant == "mosaic":
            yield mosaic(chosen, i, 2)
        elif variant == "mosaic3":
            yield mosaic(chosen, i, 3)
        elif variant == "lowq":
            yield degraded(img)
        else:
            raise CalibrationError(f"unknown image variant {variant!r}; known: {', '.join(VARIANTS)}")


def small(image: np.ndarray) -> np.ndarray:
    """``image`` mirrored at half size in the top-left corner of a grey frame of its own size: the same
    scene with objects a quarter of the area, where localization in INT8 is hardest (a pixel is more IoU)."""
    cv2 = lazy_import("cv2", "the calibration check set")
    h, w = image.shape[:2]
    out = np.full_like(image, 114)
    half = cv2.resize(image[:, ::-1], (max(1, w // 2), max(1, h // 2)), interpolation=cv2.INTER_AREA)
    out[: half.shape[0], : half.shape[1]] = half
    return out


def mosaic(images: Sequence[np.ndarray], first: int, n: int) -> np.ndarray:
    """``n x n`` of ``images`` (from ``first`` on, wrapping around) tiled in a frame of the first one's size,
    each shrunk to fit its cell with its aspect kept: a crowded scene of small objects, as from a camera
    looking over a street or a hall (objects 1/n^2 of their area; the cell's margin is grey)."""
    cv2 = lazy_import("cv2", "the calibration check set")
    h, w = images[first % len(images)].shape[:2]
    out = np.full((h, w, 3), 114, np.uint8)
    ch, cw = h // n, w // n
    for k in range(n * n):
        img = images[(first + k) % len(images)]
        r = min(ch / img.shape[0], cw / img.shape[1])
        th, tw = max(1, int(img.shape[0] * r)), max(1, int(img.shape[1] * r))
        tile = cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA)
        y, x = (k // n) * ch, (k % n) * cw
        out[y: y + th, x: x + tw] = tile
    return out


def degraded(image: np.ndarray, quality: int = 40) -> np.ndarray:
    """``image`` at half resolution and back (bilinear), then through JPEG at ``quality``: the soft edges and
    block artefacts of low-bitrate surveillance video (MPEG-4 at 768x576, as the asset clip)."""
    cv2 = lazy_import("cv2", "the calibration variants")
    h, w = image.shape[:2]
    low = cv2.resize(image, (max(1, w // 2), max(1, h // 2)), interpolation=cv2.INTER_AREA)
    back: np.ndarray = cv2.resize(low, (w, h), interpolation=cv2.INTER_LINEAR)
    ok, data = cv2.imencode(".jpg", back, [int(cv2.IMWRITE_JPEG_QUALITY), quality])
    if not ok:
        return back
    out = cv2.imdecode(data, cv2.IMREAD_COLOR)
    result: np.ndarray = back if out is None else np.ascontiguousarray(out)
    return result
