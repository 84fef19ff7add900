"""Issue 25, "no silent loss": an MP4 whose run is killed before it can close the file (SIGKILL, systemd's after
``TimeoutStopSec``, a power cut) still plays up to its last fragment. The file is written fragmented (an index
per group of frames); written whole at the end only, as before, it had no index at all and played nothing.

The real CLI in a subprocess on a looping video, killed once it has written a few hundred frames.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import cv2
import pytest

from tests.faults.conftest import Cli


def test_a_killed_run_leaves_an_mp4_that_plays_up_to_its_last_fragment(tmp_path: Path,
                                                                         media: dict[str, Path]) -> None:
    pytest.importorskip("av", reason="H.264 through PyAV (pip install 'edgert[video]')")
    events, video = tmp_path / "e.jsonl", tmp_path / "out.mp4"
    run = Cli("run", "--model", str(media["model"]), "--source", str(media["long"]), "--loop",
              "--sink", f"jsonl://{events}", "--sink", str(video))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert run.proc.poll() is None, run.stderr
            if events.exists() and events.read_bytes().count(b"\n") >= 700:
                break
            time.sleep(0.1)
        run.signal(signal.SIGKILL)
        run.proc.wait(30)
    finally:
        run.kill()
    written = [json.loads(line) for line in events.read_text(encoding="utf-8").splitlines() if line.endswith("}")]
    assert len(written) >= 700
    cap = cv2.VideoCapture(str(video))
    played = 0
    while cap.read()[0]:
        played += 1
    cap.release()
    # Every fragment before the kill plays: all but the last 2 s (20 frames here), the encoder's look-ahead and
    # the sink's queue.
    assert len(written) - 100 <= played <= len(written), (played, len(written))
