"""Issue 25, case 7: memory held in frames is bounded at start, and a graceful stop has a deadline.

The real CLI: a run whose frames would hold more than the limit is refused before any output is touched;
a run whose events go to a FIFO read slowly (a sink that would take minutes to drain) stops within its
deadline after SIGTERM, dropping and counting what was queued, with its video finalised.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.faults.conftest import Cli
from tests.helpers import assert_one_line_error, run_cli


def test_frame_memory_over_the_limit_is_refused_at_start(tmp_path: Path, media: dict[str, Path]) -> None:
    out = tmp_path / "e.jsonl"
    out.write_text("old\n")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nruntime: {{queue_size: 64}}\nsources:\n"
                   + "".join(f"  - {{uri: '{media['video']}', name: s{i}}}\n" for i in range(4))
                   + f"sinks: ['jsonl://{out}']\n", encoding="utf-8")
    # 4 sources x 64 frames x 96x64x3 bytes = 4.5 MB
    refused = run_cli("run", "--config", str(cfg), env={"EDGERT_FRAME_MEMORY_MB": "2"})
    assert_one_line_error(refused, "the frames in flight would hold 4.5 MB (4 sources x 64 frames", "queue_size")
    assert out.read_text() == "old\n"
    fine = run_cli("run", "--config", str(cfg), env={"EDGERT_FRAME_MEMORY_MB": "16"})
    assert fine.returncode == 0, fine.stderr
    bad = run_cli("run", "--config", str(cfg), env={"EDGERT_FRAME_MEMORY_MB": "lots"})
    assert_one_line_error(bad, "EDGERT_FRAME_MEMORY_MB='lots': expected a number")


def test_a_slow_sink_does_not_hold_the_stop_past_its_deadline(tmp_path: Path, media: dict[str, Path]) -> None:
    cv2 = pytest.importorskip("cv2")
    fifo, video = tmp_path / "events.fifo", tmp_path / "out.mp4"
    os.mkfifo(fifo)
    lines: list[bytes] = []
    done, fast = threading.Event(), threading.Event()

    def slow_reader() -> None:  # 10 lines a second: the 1024 queued would take 100 s to drain
        with open(fifo, "rb") as f:
            for line in f:
                lines.append(line)
                if not fast.is_set():
                    time.sleep(0.1)
        done.set()

    reader = threading.Thread(target=slow_reader, daemon=True)
    reader.start()
    run = Cli("-v", "run", "--model", str(media["model"]), "--source", str(media["long"]), "--loop",
              "--sink", f"jsonl://{fifo}", "--sink", str(video), "--json", env={"EDGERT_STOP_DEADLINE_S": "1"})
    try:
        run.wait_for("opened video")
        time.sleep(2.0)  # the sink's queue fills behind the slow reader
        run.signal()
        code, out = run.finish(30)
    finally:
        run.kill()
        fast.set()  # what is left in the pipe's buffer after the exit: read it at once
    assert code == 0, run.stderr
    assert "the stop took longer than 1 s" in run.stderr
    summary = json.loads(out)
    assert summary["drops"].get(f"sink:jsonl://{fifo}", 0) > 0, summary["drops"]
    assert "stop_deadline" in summary["drops"]
    assert done.wait(10)  # the FIFO was closed: the reader saw its end
    assert all(line.endswith(b"\n") and json.loads(line) for line in lines)  # whole lines only
    cap = cv2.VideoCapture(str(video))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) > 0  # the video was finalised (its index written)
