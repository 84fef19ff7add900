"""A calibration set from a folder of images: found recursively, sampled deterministically, decoded lazily.

Files are listed in sorted order and drawn in the order of a seeded permutation, so the same folder,
``num`` and ``seed`` give the same images on every machine. A file that is not an image (by suffix)
or does not decode is skipped and counted, and the next file of the permutation takes its place:
a calibration run never crashes on one bad file, and says how many it skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgert.errors import CalibrationError
from edgert.image_file import ENV_MAX_PIXELS, ImageSkipped, ImageTooLarge, decode_image_file, max_pixels

__all__ = ["IMAGE_SUFFIXES", "CalibrationImages", "scan_folder"]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def scan_folder(root: str | Path) -> tuple[list[Path], list[Path]]:
    """``(image files, other files)`` under ``root``, recursively, sorted; hidden entries ignored."""
    base = Path(root)
    if not base.exists():
        raise CalibrationError(f"{base}: image folder not found")
    if not base.is_dir():
        raise CalibrationError(f"{base}: not a folder. Note: --images takes a folder of JPEG/PNG/BMP/WebP files")
    images: list[Path] = []
    others: list[Path] = []
    try:
        entries = sorted(base.rglob("*"))
    except OSError as exc:
        raise CalibrationError(f"{base}: cannot list the folder: {exc}") from exc
    for path in entries:
        rel = path.relative_to(base)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if not path.is_file():
            continue
        (images if path.suffix.lower() in IMAGE_SUFFIXES else others).append(path)
    return images, others


@dataclass
class CalibrationImages:
    """``num`` images drawn from ``root`` with ``seed``; iterate for ``(path, BGR uint8 image)``.

    ``exclude`` removes files (e.g. the images a model was calibrated on, when measuring accuracy).
    After iterating, ``used`` lists the images delivered and ``skipped`` maps skipped files to why.
    """

    root: str | Path
    num: int | None = None
    seed: int = 0
    exclude: frozenset[Path] = frozenset()
    quiet: bool = False  # no warnings about skipped files (a second pass over a folder already reported)
    used: list[Path] = field(default_factory=list, init=False)
    skipped: dict[Path, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.num is not None and self.num < 1:
            raise CalibrationError(f"--num must be at least 1, got {self.num}")
        images, others = scan_folder(self.root)
        excluded = {p.resolve() for p in self.exclude}
        self.candidates = [p for p in images if p.resolve() not in excluded]
        self.not_images = others
        if not self.candidates:
            extra = f" ({len(others)} other files ignored)" if others else ""
            raise CalibrationError(
                f"{self.root}: no images to calibrate with{extra}. Note: put JPEG, PNG, BMP or WebP files in it"
            )
        rng = np.random.default_rng(self.seed)
        self.order = [self.candidates[i] for i in rng.permutation(len(self.candidates))]
        self.target = len(self.order) if self.num is None else min(self.num, len(self.order))

    def __len__(self) -> int:
        return self.target

    def __iter__(self) -> Iterator[tuple[Path, np.ndarray]]:
        self.used = []
        self.skipped = {p: "not an image file" for p in self.not_images}
        budget = max_pixels()
        for path in self.order:
            if len(self.used) >= self.target:
                break
            try:
                image = decode_image_file(path, budget)  # bounded, and by bytes: any file name works
            except ImageTooLarge as exc:
                self.skipped[path] = f"too large: {exc.reason}"
                continue
            except ImageSkipped:
                self.skipped[path] = "unreadable or corrupt image"
                continue
            self.used.append(path)
            yield path, image
        if not self.used:
            raise CalibrationError(f"{self.root}: none of {len(self.order)} image files could be read")
        if self.quiet:
            return
        if len(self.used) < (self.num or 0):
            log.warning("%s: only %d usable images, fewer than the %d asked for", self.root, len(self.used), self.num)
        if self.skipped:
            self.warn_skipped()

    def warn_skipped(self) -> None:
        large = sum(1 for r in self.skipped.values() if r.startswith("too large"))
        other = sum(1 for r in self.skipped.values() if r == "not an image file")
        bad = len(self.skipped) - large - other
        examples = ", ".join(p.name for p in list(self.skipped)[:3])
        over = f", {large} over the pixel budget of {max_pixels()} (raise it with {ENV_MAX_PIXELS})" if large else ""
        log.warning("%s: skipped %d file(s): %d unreadable image(s), %d not an image%s (%s%s)", self.root,
                    len(self.skipped), bad, other, over, examples, ", ..." if len(self.skipped) > 3 else "")

    def fingerprint(self) -> str:
        """A hash of every image file's name and bytes, plus ``num`` and ``seed``: what the draw depends on.

        Part of a calibration's cache key, so editing, adding or removing an image makes the cache stale.
        """
        h = hashlib.sha256(f"{self.num}\0{self.seed}\n".encode())
        for path in self.candidates:
            h.update(os.fsencode(path.relative_to(Path(self.root))) + b"\0")  # a name may not be UTF-8
            try:
                with path.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
            except OSError:
                h.update(b"unreadable")
        return h.hexdigest()[:16]
