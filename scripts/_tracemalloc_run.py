"""Run a module under tracemalloc and dump a snapshot on each SIGUSR1 (for ``soak.py --tracemalloc``).

    python scripts/_tracemalloc_run.py DIR edgert.cli.main run ...

Each SIGUSR1 writes ``DIR/snap-N.tm`` (``tracemalloc.Snapshot.dump``); the soak diffs them grouped by
traceback to say what grows. Kept out of edgert: it is a measuring tool, and it slows the run.
"""

from __future__ import annotations

import runpy
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 12


def main() -> None:
    folder, module, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    folder.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    taken = [0]

    def dump(signum: int, frame: FrameType | None) -> None:
        snap = tracemalloc.take_snapshot().filter_traces((
            tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        ))
        snap.dump(str(folder / f"snap-{taken[0]}.tm"))
        (folder / f"snap-{taken[0]}.done").write_text("")
        taken[0] += 1

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
