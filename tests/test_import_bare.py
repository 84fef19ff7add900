"""``import edgert`` (and every module of it) works with only the core dependencies."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

# Runs in a fresh interpreter where the optional packages cannot be imported, as on a bare install.
# (prometheus_client is a core dependency: pyproject.toml says why.)
_PROBE = r"""
import importlib, pkgutil, sys

BLOCKED = {"onnxruntime", "cv2", "pycuda", "tensorrt", "tensorrt_rtx", "pynvml", "tokenizers",
           "soundfile", "sounddevice", "librosa", "scipy", "psutil", "pycocotools", "trackers",
           "supervision", "paho"}

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} blocked for this test")
        return None

sys.meta_path.insert(0, Block())
import edgert
assert edgert.__version__
import edgert.cli.main as main
main.build_parser()  # every subcommand registers without its optional dependency
failed = []
for mod in pkgutil.walk_packages(edgert.__path__, "edgert."):
    try:
        importlib.import_module(mod.name)
    except Exception as exc:
        failed.append(f"{mod.name}: {exc!r}")
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print("FAILED", failed)
print("LEAKED", leaked)
sys.exit(1 if failed or leaked else 0)
"""


def test_every_module_imports_without_optional_packages() -> None:
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_edgert_loads_no_framework() -> None:
    # numpy alone: not even PyYAML or onnx, which the config loader and the model readers import when used
    code = ("import sys, edgert; print(sorted(m for m in ('onnxruntime','cv2','torch','pycuda','yaml','onnx') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_help_lists_every_subcommand_and_each_help_works() -> None:
    from edgert.cli.main import SUBCOMMANDS

    result = subprocess.run([sys.executable, "-m", "edgert.cli.main", "--help"], capture_output=True,
                            text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0
    for name in SUBCOMMANDS:
        assert name in result.stdout
        sub = subprocess.run([sys.executable, "-m", "edgert.cli.main", name, "--help"], capture_output=True,
                             text=True, cwd=ROOT, timeout=60)
        assert sub.returncode == 0, sub.stderr
        assert "usage: edgert " + name in sub.stdout
