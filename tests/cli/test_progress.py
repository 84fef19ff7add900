"""Long commands show progress: a bar with the total on a terminal (read here from a pseudo-terminal), a few
plain lines in a pipe, nothing with --json."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from edgert.cli.progress import Progress
from tests.helpers import run_cli
from tests.pipeline.media import make_video, tiny_detector


def _on_a_terminal(*args: str, cwd: Path, columns: int = 0) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal; (exit code, stdout, what the terminal showed). A new
    pseudo-terminal reports a size of 0x0, as a serial console does; ``columns`` gives it a window's.

    This side keeps the terminal's other end open until the command has exited and everything it wrote is
    read: Linux drops what is unread once the last writer closes it."""
    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "edgert.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL, cwd=cwd, env=env)
    shown = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                shown += os.read(master, 65536)
            elif proc.poll() is not None:
                break
        out = proc.stdout.read().decode() if proc.stdout is not None else ""
    finally:
        os.close(slave)
        os.close(master)
    return proc.wait(timeout=120), out, shown.decode(errors="replace")


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("progress")
    return {"video": make_video(root / "v.avi", frames=40), "model": tiny_detector(root / "t.onnx")}


def test_bench_shows_a_bar_with_its_total_on_a_terminal(media: dict[str, Path], tmp_path: Path) -> None:
    code, out, shown = _on_a_terminal("bench", str(media["model"]), "--backend", "onnxruntime",
                                      "--iterations", "30", "--warmup", "5", cwd=tmp_path, columns=100)
    assert code == 0, shown
    assert "/35" in shown and "bench t.onnx" in shown, shown  # 5 warm-up + 30 timed calls
    assert "throughput" in out


def test_run_on_a_file_shows_the_frame_total_on_a_terminal(media: dict[str, Path], tmp_path: Path) -> None:
    code, out, shown = _on_a_terminal("run", "--model", str(media["model"]), "--source", str(media["video"]),
                                      "--backend", "onnxruntime", "--processing", "cpu", cwd=tmp_path)
    assert code == 0, shown
    assert re.search(r"\d+/40 \[", shown), shown  # tqdm's "n/total [elapsed..." with the file's 40 frames
    assert "frames     40" in out


def test_plain_lines_in_a_pipe_and_none_with_json(media: dict[str, Path], tmp_path: Path) -> None:
    r = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]), "--backend",
                "onnxruntime", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("edgert: run:")]
    assert lines[0] == "edgert: run: 40 frames" and lines[-1].startswith("edgert: run: done, 40 frames in ")
    assert 2 <= len(lines) <= 5 and "\r" not in r.stderr
    r = run_cli("bench", str(media["model"]), "--backend", "onnxruntime", "--iterations", "10", "--json",
                cwd=tmp_path)
    assert r.returncode == 0 and "edgert: bench" not in r.stderr, r.stderr


def test_plain_progress_prints_quarters_and_the_end() -> None:
    stream = io.StringIO()
    with Progress("val", total=100, unit="image", stream=stream, terminal=False) as p:
        for _ in range(100):
            p.update()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "edgert: val: 100 images"
    assert lines[1:4] == [f"edgert: val: {n}/100 images ({n}%)" for n in (25, 50, 75)]
    assert lines[4].startswith("edgert: val: done, 100 images in ") and len(lines) == 5
    quiet = io.StringIO()
    with Progress("val", total=3, stream=quiet, quiet=True) as p:
        p.update(3)
    assert quiet.getvalue() == "" and p.count == 3




def test_steps_print_a_line_each() -> None:
    stream = io.StringIO()
    with Progress("convert m.onnx", total=2, unit="step", stream=stream, terminal=False) as p:
        p.step("converting to FP16")
        p.step("checking")
    lines = stream.getvalue().splitlines()
    assert lines[:2] == ["edgert: convert m.onnx: 1/2 converting to FP16", "edgert: convert m.onnx: 2/2 checking"]
    assert lines[2].startswith("edgert: convert m.onnx: done, 2 steps in ") and len(lines) == 3



def test_a_live_source_in_a_log_gets_no_progress_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """A camera has no end to count towards: a service's journal must not fill with progress lines."""
    from edgert.cli.run import _Progress

    for total, shown in ((None, False), (1, False), (30, True)):  # a camera, one image, a file
        observer = _Progress()
        observer.on_start({"expected_frames": total})
        observer.on_stop({"frames": 30})
        assert ("edgert: run:" in capsys.readouterr().err) is shown, total
