"""A persistent TensorRT timing cache, one file per (TensorRT flavour and version, GPU, CUDA driver).

The timing cache keeps the kernel timings of earlier builds, so rebuilding an engine (a new ONNX export,
another precision) on a Jetson takes seconds instead of many minutes. Timings are only valid for the
GPU, CUDA and TensorRT that measured them, so the file name carries all three.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any

from edgert.builder.target import TargetInfo
from edgert.engine.file import write_atomic

__all__ = ["TimingCache", "default_cache_dir", "timing_cache_path"]

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$EDGERT_CACHE_DIR`` or ``$XDG_CACHE_HOME/edgert`` or ``~/.cache/edgert``."""
    env = os.environ.get("EDGERT_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edgert"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "none"


def timing_cache_path(target: TargetInfo, cache_dir: Path | None = None) -> Path:
    gpu = target.gpu
    parts = [
        target.backend,
        target.trt_version,
        _slug(gpu.name),
        f"sm{gpu.compute_capability}" if gpu.compute_capability else "sm-none",
        f"driver{gpu.cuda_driver}" if gpu.cuda_driver else "driver-none",
    ]
    return (cache_dir or default_cache_dir()) / "timing" / (_slug("_".join(parts)) + ".cache")


class TimingCache:
    """Loads the cache into a builder config before a build and saves the merged cache after it (merged again
    with the file, so builds running side by side each add their timings)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loaded = b""  # the file as attach() read it: save() merges only what other builds wrote since

    def attach(self, config: Any) -> None:
        """Give ``config`` (a TensorRT ``IBuilderConfig``) the stored timings, or an empty cache."""
        data = b""
        if self.path.exists():
            try:
                data = self.path.read_bytes()
            except OSError as exc:
                log.warning("cannot read timing cache %s (%s); starting an empty one", self.path, exc.strerror)
        cache = config.create_timing_cache(data)
        if cache is None and data:
            log.warning("timing cache %s is not usable by this TensorRT; starting an empty one", self.path)
            cache = config.create_timing_cache(b"")
        if cache is None:
            return
        # ignore_mismatch=False: a cache from another device or version is refused rather than misused.
        if not config.set_timing_cache(cache, False):
            log.warning("timing cache %s does not match this device; starting an empty one", self.path)
            config.set_timing_cache(config.create_timing_cache(b""), False)
            return
        self.loaded = data
        log.debug("timing cache %s: %d bytes loaded", self.path, len(data))

    def save(self, config: Any) -> None:
        """Write this build's timings merged with what the file holds now: a build that ran beside this one
        (another engine, a background model update) saved its own timings meanwhile, and they are kept."""
        cache = config.get_timing_cache()
        if cache is None:
            return
        with contextlib.suppress(OSError):  # no file yet, or unreadable: this build's timings alone
            on_disk = self.path.read_bytes()
            # unchanged since attach(): this build's cache holds it already, and nothing is merged (on an H100,
            # TensorRT 8.5's combine() returned False for each build after the first, one build at a time)
            other = config.create_timing_cache(on_disk) if on_disk and on_disk != self.loaded else None
            # ignore_mismatch=False: timings from another device or version are left out, not merged
            if other is not None and not cache.combine(other, False):
                log.warning("timing cache %s could not be merged with this build's timings; replacing it", self.path)
        try:
            data = bytes(memoryview(cache.serialize()))
            write_atomic(self.path, data)
            log.debug("timing cache %s: %d bytes saved", self.path, len(data))
        except OSError as exc:
            log.warning("cannot save timing cache %s (%s)", self.path, exc.strerror)
