"""Python 3.8 (JetPack 5) is the minimum: typing syntax evaluated at run time is found, and edgert has none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_runtime_typing.py"


def _check(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, paths)], capture_output=True, text=True, timeout=120)


def test_runtime_typing_syntax_is_found(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from __future__ import annotations\n"
        "from collections.abc import Callable\n"
        "from typing import cast\n"
        "Alias = Callable[[int], None]\n"
        "Maybe = int | None\n"
        "def f(x: list[int] | None) -> tuple[int, ...]:\n"  # annotations: fine
        "    y: dict[str, int] | None = None\n"
        "    return cast(tuple[int, ...], isinstance(x, int | str))\n"
    )
    res = _check(bad)
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert [int(line.split(":")[1]) for line in lines] == [4, 5, 8, 8]


def test_edgert_has_no_runtime_typing_syntax_newer_than_38() -> None:
    res = _check(ROOT / "edgert", ROOT / "apps")
    assert res.returncode == 0, res.stdout


def test_vermin_finds_nothing_newer_than_38() -> None:
    vermin = Path(sys.executable).parent / "vermin"
    if not vermin.exists():
        pytest.skip("vermin is not installed (pip install -e '.[dev]')")
    res = subprocess.run([str(vermin), "--target=3.8-", "--violations", "--no-tips", "--no-eval-annotations",
                          str(ROOT / "edgert")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout


def test_build_progress_flags_parse_without_boolean_optional_action() -> None:
    import argparse

    from edgert.cli import build

    parser = argparse.ArgumentParser()
    build.register(parser.add_subparsers())
    assert parser.parse_args(["build", "m.onnx"]).progress is None
    assert parser.parse_args(["build", "m.onnx", "--progress"]).progress is True
    assert parser.parse_args(["build", "m.onnx", "--no-progress"]).progress is False
