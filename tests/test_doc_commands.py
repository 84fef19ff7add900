"""Every shell command block in README.md and docs/*.md, and the README's Python block, runs as written.

Each ```bash / ```sh block runs as one ``bash -e`` script in a copy of the repository with nothing beside it
(no ``../shared``, ``EDGERT_ASSETS`` unset), with the names the docs use for "your model" or "your photos"
staged from the data the package carries (:mod:`edgert.demo_files`: ``yolov8n.onnx``, ``nanodet.onnx`` are
the FP32 NanoDet rebuilt from it, ``~/calib-photos`` its photos, ``street.mp4`` its clip). A command whose
comment says ``[needs ...]`` (a Jetson, a camera, TensorRT, systemd, root, a broker, the full assets,
minutes of work) is left out and reported; every other line must exit 0.

Setting up is the one thing not done for real (a fresh venv and its downloads take minutes): on this test's
PATH, ``python3 -m venv DIR`` makes DIR/bin/{python,pip,edgert} that run the test's own interpreter with the
copy first on ``PYTHONPATH``, and ``pip install`` checks that every extra it is asked for exists in
pyproject.toml and installs nothing. ``tests/cli/test_first_hour.py`` runs README command 1 on a bare clone.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_first_hour import _clone
from tests.helpers import ROOT
from tests.pipeline.media import tiny_detector

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"#.*\[needs ([^\]]+)\]")
PIP_SHIM = r'''
import re, sys, tomllib
extras = set(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"])
for arg in sys.argv[2:]:
    m = re.match(r"^(?:\.|edgert|/.*)\[([^\]]*)\]$", arg)
    if m:
        unknown = [e for e in m.group(1).split(",") if e and e not in extras]
        if unknown:
            sys.exit(f"pip shim: no extra {unknown} in pyproject.toml")
'''


def blocks() -> list[tuple[str, int, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for k, m in enumerate(re.finditer(r"^```(?:bash|sh)\n(.*?)^```", text, re.S | re.M)):
            out.append((doc.relative_to(ROOT).as_posix(), k, m.group(1)))
    return out


def commands(block: str) -> list[str]:
    """The block's logical lines (backslash continuations joined), comments and blanks kept out."""
    out, pending = [], ""
    for line in block.splitlines():
        pending += line
        if line.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1] + " "
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            out.append(pending)
        pending = ""
    return out


def _shims(bin_dir: Path, clone: Path) -> None:
    bin_dir.mkdir(parents=True)
    py = sys.executable
    (bin_dir / "pip_shim.py").write_text(PIP_SHIM)
    scripts = {
        "edgert": f'#!/bin/sh\nexec {py} -m edgert.cli.main "$@"\n',
        "python": f'#!/bin/sh\nexec {py} "$@"\n',
        "pip": (f'#!/bin/sh\n[ "$1" = install ] || exit 0\n'
                f'exec {py} {bin_dir}/pip_shim.py {clone}/pyproject.toml "$@"\n'),
        "python3": (f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = venv ]; then\n'
                    f'  for a in "$@"; do d="$a"; done\n  mkdir -p "$d/bin"\n'
                    f'  for t in edgert python pip; do cp {bin_dir}/$t "$d/bin/$t"; done\n  exit 0\nfi\n'
                    f'exec {py} "$@"\n'),
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


def _stage(top: Path, clone: Path) -> None:
    """The files the docs name as the reader's own, made from the packaged data (no ../shared)."""
    from edgert.demo_files import demo_files

    files = demo_files(top / "demo-files")
    for name in ("nanodet.onnx", "yolov8n.onnx", "yolov8s.onnx"):
        shutil.copy2(files.model, clone / name)
    tiny_detector(clone / "model.onnx")  # `edgert bench model.onnx`: any model; a small one is quick
    shutil.copy2(files.video, clone / "street.mp4")
    shutil.copytree(files.photos, top / "home" / "calib-photos")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    top = tmp_path_factory.mktemp("docs")
    clone = _clone(top / "edgert")
    _shims(top / "bin", clone)
    _stage(top, clone)
    assert not (top / "shared").exists()
    env = {"PATH": f"{top / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(top / "home"),
           "PYTHONPATH": str(clone), "LANG": "C.UTF-8"}
    return clone, env


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "index", "block"), blocks(), ids=lambda v: str(v).split("\n")[0][:40])
def test_doc_command_block_runs_as_written(doc: str, index: int, block: str,
                                           workspace: tuple[Path, dict[str, str]]) -> None:
    clone, env = workspace
    script, skipped = ["set -e"], []
    for command in commands(block):
        needs = MARKER.search(command)
        if needs:
            skipped.append(needs.group(1))
            continue
        script.append(command)
    if len(script) == 1:
        pytest.skip(f"{doc} block {index}: every command needs {', '.join(sorted(set(skipped)))}")
    r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=clone, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{doc} block {index} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


@pytest.mark.slow
@pytest.mark.parametrize("block", python_blocks(), ids=lambda v: v.split("\n")[2][:30])
def test_readme_python_block_runs_as_written(block: str, workspace: tuple[Path, dict[str, str]]) -> None:
    clone, env = workspace
    r = subprocess.run([sys.executable, "-c", block], cwd=clone, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"README Python block failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_every_block_is_found_and_markers_are_recognised() -> None:
    found = blocks()
    assert any(doc == "README.md" and "edgert demo" in text for doc, _, text in found)
    readme_lines = [c for doc, _, text in found if doc == "README.md" for c in commands(text)]
    assert any("sudo jetson/install.sh" in c and MARKER.search(c) for c in readme_lines)
    assert all(not c.lstrip().startswith("sudo") or MARKER.search(c) for _, _, t in found for c in commands(t))


def test_the_pip_stand_in_refuses_an_extra_that_does_not_exist(tmp_path: Path) -> None:
    """So a README that names a wrong extra fails its block."""
    _shims(tmp_path / "bin", ROOT)
    ok = subprocess.run([str(tmp_path / "bin" / "pip"), "install", "-q", "-e", ".[cpu,opencv,video]"],
                        capture_output=True, text=True)
    bad = subprocess.run([str(tmp_path / "bin" / "pip"), "install", "-e", ".[cpu,nosuch]"],
                         capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert bad.returncode != 0 and "nosuch" in bad.stderr
