"""Outputs never replace inputs, and what killed writers leave behind is removed by the next run.

``edgert convert X -o X`` and ``edgert calibrate X -o X`` overwrote the FP32 source (rc 0), where ``rebatch``
refused; a writer killed before its rename (SIGKILL, the OOM killer) left its temporary file beside the output,
or its scratch folder in the system's temporary folder, and nothing removed them (4-34 MB each).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgert.atomic_file import sha256_file
from tests.calib.models import write_images
from tests.helpers import ROOT, assert_one_line_error, run_cli

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("command", ["convert", "calibrate"])
def test_an_output_that_is_the_source_is_refused(tmp_path: Path, media: dict[str, Path], command: str) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(media["model"].read_bytes())
    before = sha256_file(model)
    os.symlink(model, tmp_path / "link.onnx")
    images = write_images(tmp_path / "images", 3)[0].parent
    extra = ["--images", str(images), "--no-check"] if command == "calibrate" else []
    for spelling in (str(model), str(tmp_path / "link.onnx"), str(tmp_path / "images" / ".." / "m.onnx")):
        refused = run_cli(command, str(model), *extra, "-o", spelling)
        assert_one_line_error(refused, "-o", "that is the source model")
    assert sha256_file(model) == before


def _killed_writer(code: str, env: dict[str, str] | None = None) -> None:
    """Run ``code`` (which writes a temporary file or folder) in a real process that SIGKILLs itself in the middle."""
    script = f"import os, signal\nfrom pathlib import Path\n{code}\n"
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr


def test_temporary_files_of_killed_writers_are_removed_by_the_next_run(tmp_path: Path, media: dict[str, Path]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target = out / "m.fp16.onnx"
    _killed_writer(f"from edgert.atomic_file import atomic_path\n"
                   f"with atomic_path({str(target)!r}) as tmp:\n"
                   f"    tmp.write_bytes(bytes(4 << 20))\n"
                   f"    os.kill(os.getpid(), signal.SIGKILL)")
    assert [p.name.startswith(".m.fp16.onnx.tmp-") for p in out.iterdir()] == [True]
    _killed_writer(f"import edgert.atomic_file as a, tempfile\n"
                   f"a.os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)\n"
                   f"a.replace_file({str(out / 'm.engine')!r}, bytes(1 << 20))")
    # the second writer's first write into the folder removed the first one's stray; its own is left
    assert [p.name.startswith(".m.engine.tmp-") for p in out.iterdir()] == [True]

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    _killed_writer("from edgert.atomic_file import scratch_folder\n"
                   "with scratch_folder('calib') as d:\n"
                   "    (d / 'candidate.onnx').write_bytes(bytes(4 << 20))\n"
                   "    os.kill(os.getpid(), signal.SIGKILL)", env)
    assert [p.name.startswith("edgert-calib.tmp-") for p in scratch.iterdir()] == [True]

    converted = run_cli("convert", str(media["model"]), "-o", str(target), "--no-check")
    assert converted.returncode == 0, converted.stderr
    assert sorted(p.name for p in out.iterdir()) == ["m.fp16.onnx"]  # the stray gone, the output there

    images = write_images(tmp_path / "images", 3)[0].parent
    calibrated = run_cli("calibrate", str(media["model"]), "--images", str(images), "--num", "3", "--no-check",
                         "--trt-version", "8.6.2", "-o", str(tmp_path / "q" / "m.int8.onnx"), env=env)
    assert calibrated.returncode == 0, calibrated.stderr
    # the killed run's scratch folder, and this run's own (other libraries leave their own files there)
    assert [p for p in scratch.iterdir() if p.name.startswith("edgert-")] == []
