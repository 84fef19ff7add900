"""What the fault tests share: a tiny real detector, real videos, free loopback ports, the CLI as a process."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT
from tests.pipeline.media import make_video, tiny_detector


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released: connecting is refused at once)."""
    return free_port()


@pytest.fixture(scope="session")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("cv2", reason="the fault tests run the CLI on real videos (pip install opencv-python)")
    pytest.importorskip("onnxruntime", reason="the fault tests run a real model (pip install onnxruntime)")
    root = tmp_path_factory.mktemp("faults")
    return {"model": tiny_detector(root / "t.onnx"), "video": make_video(root / "v.avi", frames=40),
            "long": make_video(root / "long.avi", frames=200)}


def start_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen[str]:
    """``python -m edgert.cli.main ARGS`` in the background, as a user (or systemd) would start it."""
    return subprocess.Popen([sys.executable, "-m", "edgert.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, cwd=cwd or ROOT)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", "replace")


def wait_http(url: str, proc: subprocess.Popen[str], timeout: float = 60.0, needle: str = "") -> str:
    """The body of ``url`` once it answers 200 (and holds ``needle``), while ``proc`` still runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.communicate()[1]}")
        try:
            status, body = http_get(url, 2.0)
            if status == 200 and needle in body:
                return body
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer with {needle!r} within {timeout} s")


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 60.0) -> tuple[str, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return out, err


def summary_of(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout))


def sources_at_stop(run: Cli, timeout: float = 60) -> dict[str, dict[str, Any]]:
    """SIGTERM to ``run``, its clean exit, and its ``--json`` summary's sources by name."""
    run.signal()
    code, out = run.finish(timeout)
    assert code == 0, run.stderr
    return {s["name"]: s for s in summary_of(out)["sources"]}


class Cli:
    """The CLI running in the background, its stderr collected line by line as it comes."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        import threading

        self.proc = start_cli(*args, env=env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.stderr:
                return
            if self.proc.poll() is not None:
                self._reader.join(5)
                if needle in self.stderr:
                    return
                raise AssertionError(f"the run ended ({self.proc.returncode}) without {needle!r}: {self.stderr}")
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} within {timeout} s: {self.stderr}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        """Wait for the exit; (exit status, stdout)."""
        assert self.proc.stdout is not None
        out = self.proc.stdout.read() if self.proc.wait(timeout) is not None else ""
        self._reader.join(5)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def late_server(media: dict[str, Path]) -> Iterator[tuple[int, threading.Event]]:
    """An HTTP server for the test video that starts listening only when told to (a camera still booting)."""
    port = free_port()
    go = threading.Event()
    folder = str(media["video"].parent)
    servers: list[http.server.ThreadingHTTPServer] = []

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=folder, **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            pass

    def serve() -> None:
        go.wait()
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Quiet)
        servers.append(server)
        server.serve_forever(poll_interval=0.1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, go
    go.set()
    for server in servers:
        server.shutdown()
