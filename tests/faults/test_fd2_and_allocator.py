"""Issue 25: what C libraries write to fd 2 goes through redaction (edgert.redact_stderr), and the allocator
settings a long run is started with (edgert.allocator, the unit's environment), each in a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SECRET = "Pw5ecretFd2"

_WRITER = f"""
import ctypes, os, subprocess, sys
from edgert.redact_stderr import redact_fd2
assert redact_fd2() and not redact_fd2()  # once
os.write(2, b"[tcp @ 0x1] rtsp://admin:{SECRET}@10.0.0.7/stream?token={SECRET} failed\\n")  # as C writes
libc = ctypes.CDLL(None)
libc.dprintf(2, b"gst: location=rtsp://u:{SECRET}@cam/s\\n")
subprocess.run(["sh", "-c", "echo child: http://u:{SECRET}@h/v.avi >&2"], check=True)  # a worker inherits fd 2
sys.stderr.write("partial line without newline http://u:{SECRET}@h/x")
"""


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fd 2 plumbing and dprintf: Linux")
def test_what_c_code_and_children_write_to_fd2_is_redacted() -> None:
    proc = _run(_WRITER)
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stderr, proc.stderr
    assert "rtsp://***@10.0.0.7/stream?token=***" in proc.stderr
    assert "location=rtsp://***@cam/s" in proc.stderr and "child: http://***@h/v.avi" in proc.stderr
    assert "partial line without newline http://***@h/x" in proc.stderr  # written out at exit


def test_no_credential_no_pipe() -> None:
    proc = _run("import os\nfrom edgert.redact_stderr import redact_fd2_for\n"
                "before = os.readlink('/proc/self/fd/2')\n"
                "print(redact_fd2_for(['rtsp://10.0.0.7/s', 'cam.mp4']), os.readlink('/proc/self/fd/2') == before)\n"
                "print(redact_fd2_for(['rtsp://${U}:${P}@10.0.0.7/s']), os.readlink('/proc/self/fd/2') == before)\n",
                env={"U": "admin", "P": SECRET})
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split("\n")[:2]
    assert first == "False True"  # nothing to hide: fd 2 left as it was
    assert second == "True False"  # a ${VAR} credential that is set is a secret at run time: fd 2 is the pump


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator and malloc_info")
def test_the_unit_sets_the_same_allocator_from_the_first_allocation() -> None:
    """The unit's environment carries edgert.allocator's settings (glibc reads them before the first allocation),
    and a process started with them runs with them: glibc's malloc_info reports two arenas at most."""
    from edgert.allocator import environment
    from edgert.config import load_config
    from edgert.service.unit import UnitOptions, render_unit

    unit = render_unit(load_config(ROOT / "jetson" / "camera.yaml"),
                       UnitOptions(name="camera", config_path="/etc/edgert/camera.yaml", edgert="/usr/bin/edgert"))
    line = next(x for x in unit.splitlines() if x.startswith("Environment=MALLOC_"))
    assert line == "Environment=" + " ".join(f"{k}={v}" for k, v in environment().items())
    code = ("import ctypes, threading, numpy\n"
            "def work():\n    [numpy.ones(200000) for _ in range(50)]\n"
            "ts = [threading.Thread(target=work) for _ in range(8)]\n[t.start() for t in ts]\n[t.join() for t in ts]\n"
            "libc = ctypes.CDLL(None)\nlibc.fdopen.restype = ctypes.c_void_p\n"
            "fp = ctypes.c_void_p(libc.fdopen(1, b'w'))\nlibc.malloc_info(0, fp)\nlibc.fflush(fp)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    from_unit = dict(item.split("=", 1) for item in line[len("Environment="):].split())  # what systemd passes
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, **from_unit})
    assert got.returncode == 0, got.stderr
    assert 1 <= got.stdout.count("<heap nr=") <= 2, got.stdout[:500]
