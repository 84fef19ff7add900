"""glibc's allocator for a run that lasts: memory that grows to its working set and stays there.

A run allocates frame-sized temporaries (a 768x576 BGR frame is 1.3 MB: decoding, drawing, the encoder's
conversion) on a dozen threads. With glibc's defaults the mmap threshold moves up after the first such block
is freed, so later ones come from per-thread arenas (up to 8 per core), each keeping freed blocks of its own:
the process's RSS kept rising by steps of one frame (1.3 MB) long after the Python heap had stopped growing
(``scripts/soak.py --tiny``: +323..+538 KB per 1000 frames after the first quarter, while tracemalloc saw
+13 KB of Python objects per 1000 frames). Fixed settings keep the heap at its working set
(the same soak, three runs with the settings below: +25, +37 and +266 KB per 1000 frames after the first
quarter, the last from two steps of 0.66 MB, a 768x576 YUV 4:2:0 frame; +171 and +11..+614 with a 4 MiB
threshold; +323..+538 with glibc's defaults; the plateau 45 MB lower than with 4 MiB, frames/s the same, 61.6
against 61.9). Those last steps were not a pool reaching its peak: heaptrack showed the video sink's PyAV path
making three frame-sized buffers per frame (two above the threshold, mapped and unmapped each frame; the
0.66 MB YUV frame from the arenas), now one reused frame (:mod:`edgert.io.sinks.encoders`), and the MP4
muxer's index of every frame, now a fragment's; with both, the native heap is flat after warm-up (docs/fleet.md
has the runs). The settings:

- ``M_ARENA_MAX`` 2: the threads share two arenas instead of each holding freed frames of its own;
- ``M_MMAP_THRESHOLD`` 1 MiB (fixed, so glibc stops moving it): a frame-sized block is mapped for its use and
  given back when freed, so no arena keeps it (a 4 MiB threshold, tried first, kept frames in the heap and
  still stepped up by one frame now and then);
- ``M_TRIM_THRESHOLD`` 256 MiB: the smaller blocks' heap top is not given back and taken again at every frame.

They must hold from the process's first allocations: set with ``mallopt`` after ``import edgert`` (numpy's
threads have made their arenas by then) they changed nothing measurable (+315 KB per 1000 frames). So they
are environment variables, which glibc reads before anything runs: the systemd unit sets :func:`environment`
(``edgert service install``), and a plain ``edgert run`` meant to last can be started the same way
(``env MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=1048576 MALLOC_TRIM_THRESHOLD_=268435456 edgert run ...``).
Off glibc (musl, macOS) the variables mean nothing and do nothing.
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
