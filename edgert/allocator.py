"""glibc's allocator set for a run that lasts: memory that grows to its working set and stays there.

A run allocates frame-sized temporaries (a 768x576 BGR frame is 1.3 MB: resizing, drawing, the encoder's
conversion) on a dozen threads. With glibc's defaults the mmap threshold moves up after the first such block
is freed, so later ones come from per-thread arenas (up to 8 per core), each keeping its own freed blocks and
trimming and regrowing its top: the process's RSS kept creeping by steps of about one frame long after the
Python heap had stopped growing (the soak: +538 KB per 1000 frames after the first quarter, while tracemalloc
saw +13 KB of Python objects per 1000 frames). Fixed settings make the heap reach its working set in the
first frames and then stay (the same soak: +64 KB per 1000 frames, ~20 MB more RSS at the plateau):

- ``M_ARENA_MAX`` 2: the threads share two arenas instead of each holding freed frames of its own;
- ``M_MMAP_THRESHOLD`` 4 MiB (fixed, so glibc stops moving it): frames are reused from the heap;
- ``M_TRIM_THRESHOLD`` 256 MiB: the heap's top is not given back and taken again at every frame.

Applied by ``edgert run`` (and ``demo``) only, never by ``import edgert``; left alone when the environment
already sets any ``MALLOC_*`` variable or ``GLIBC_TUNABLES`` names a malloc tunable (the user's choice wins),
and a no-op off glibc. ``EDGERT_MALLOC=default`` keeps glibc's own defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

__all__ = ["ENV_MALLOC", "SETTINGS", "tune_allocator"]

log = logging.getLogger(__name__)

ENV_MALLOC = "EDGERT_MALLOC"

# mallopt(3) parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
#: (name, mallopt parameter, value): what :func:`tune_allocator` sets, in this order
SETTINGS: tuple[tuple[str, int, int], ...] = (
    ("M_ARENA_MAX", _M_ARENA_MAX, 2),
    ("M_MMAP_THRESHOLD", _M_MMAP_THRESHOLD, 4 * 2**20),
    ("M_TRIM_THRESHOLD", _M_TRIM_THRESHOLD, 256 * 2**20),
)


def _user_chose() -> bool:
    if os.environ.get(ENV_MALLOC, "").strip().lower() == "default":
        return True
    if any(name.startswith("MALLOC_") for name in os.environ):
        return True
    return "malloc" in os.environ.get("GLIBC_TUNABLES", "")


def tune_allocator() -> dict[str, int] | None:
    """Set :data:`SETTINGS` with glibc's ``mallopt``; what was set, or None (not glibc, or the user chose)."""
    if _user_chose():
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, macOS, Windows: their allocators have no such knobs
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done: dict[str, int] = {}
    for label, param, value in SETTINGS:
        if mallopt(param, value) == 1:  # mallopt returns 1 on success
            done[label] = value
    log.debug("allocator: %s", ", ".join(f"{k}={v}" for k, v in done.items()) or "unchanged")
    return done or None
