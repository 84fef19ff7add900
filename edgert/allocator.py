"""glibc's allocator for a run that lasts: memory that grows to its working set and stays there.

A run allocates frame-sized temporaries (a 768x576 BGR frame is 1.3 MB) on a dozen threads. With glibc's
defaults the mmap threshold moves up after the first such block is freed, so later ones come from per-thread
arenas (up to 8 per core), each keeping freed blocks of its own, and the RSS rises by a frame now and then
long after the Python heap has stopped growing. Fixed settings keep the heap at its working set (the soak's
figures: docs/results/history-pipeline.md, "Memory over a long run"):

- ``M_ARENA_MAX`` 2: the threads share two arenas instead of each holding freed frames of its own;
- ``M_MMAP_THRESHOLD`` 1 MiB (fixed, so glibc stops moving it): a frame-sized block is mapped for its use and
  given back when freed, so no arena keeps it (4 MiB kept frames in the heap);
- ``M_TRIM_THRESHOLD`` 256 MiB: the smaller blocks' heap top is not given back and taken again at every frame.

They must hold from the process's first allocations (``mallopt`` after ``import edgert`` is too late: numpy's
threads have made their arenas by then), so they are environment variables, which glibc reads before anything
runs: the systemd unit renders :func:`environment` (``edgert service install``), and a plain ``edgert run``
meant to last can be started the same way (``env MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=1048576
MALLOC_TRIM_THRESHOLD_=268435456 edgert run ...``). Off glibc (musl, macOS) the variables do nothing.
"""

from __future__ import annotations

__all__ = ["SETTINGS", "environment"]

#: (mallopt name, environment variable, value)
SETTINGS: tuple[tuple[str, str, int], ...] = (
    ("M_ARENA_MAX", "MALLOC_ARENA_MAX", 2),
    ("M_MMAP_THRESHOLD", "MALLOC_MMAP_THRESHOLD_", 2**20),
    ("M_TRIM_THRESHOLD", "MALLOC_TRIM_THRESHOLD_", 256 * 2**20),
)


def environment() -> dict[str, str]:
    """The environment variables that set :data:`SETTINGS` for a process started with them."""
    return {variable: str(value) for _, variable, value in SETTINGS}
