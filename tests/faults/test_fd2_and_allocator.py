"""Issue 25: what C libraries write to fd 2 goes through redaction (edgert.redact_stderr), and the allocator
settings a long run uses (edgert.allocator), each in a real subprocess."""

from __future__ import annotations

import json
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


_TUNE = "import json\nfrom edgert.allocator import tune_allocator\nprint(json.dumps(tune_allocator()))\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_allocator_settings_apply_unless_the_user_chose() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    clean = subprocess.run([sys.executable, "-c", _TUNE], capture_output=True, text=True, timeout=60, cwd=ROOT,
                           env={**env, "PYTHONPATH": str(ROOT)})
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout) == {"M_ARENA_MAX": 2, "M_MMAP_THRESHOLD": 4 * 2**20,
                                        "M_TRIM_THRESHOLD": 256 * 2**20}
    for chose in ({"MALLOC_ARENA_MAX": "8"}, {"EDGERT_MALLOC": "default"},
                  {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}):
        kept = subprocess.run([sys.executable, "-c", _TUNE], capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env={**env, "PYTHONPATH": str(ROOT), **chose})
        assert kept.returncode == 0 and json.loads(kept.stdout) is None, (chose, kept.stdout, kept.stderr)
