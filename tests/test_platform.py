"""``edgert info`` on fake Jetson roots that follow the real file formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgert.platform import jetpack_for_l4t
from tests.helpers import run_cli

# /proc/device-tree/model is NUL-terminated; /etc/nv_tegra_release is as JetPack writes it.
BOARDS = {
    "orin-nano-jp6": {
        "proc/device-tree/model": b"NVIDIA Jetson Orin Nano Developer Kit\x00",
        "proc/device-tree/compatible": b"nvidia,p3768-0000+p3767-0005\x00nvidia,p3767-0005\x00nvidia,tegra234\x00",
        "etc/nv_tegra_release": (
            b"# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
            b"DATE: Wed Jan  8 01:49:37 UTC 2025\n# KERNEL_VARIANT: oot\n"
            b"TARGET_USERSPACE_LIB_DIR=nvidia\nTARGET_USERSPACE_LIB_DIR_PATH=usr/lib/aarch64-linux-gnu/nvidia\n"
        ),
        "dev/video0": b"",
        "dev/nvgpu/igpu0/ctrl": b"",
        "var/lib/nvpmodel/status": b"pmode:0001 fmode:quiet\n",
    },
    "xavier-nx-jp5": {
        "proc/device-tree/model": b"NVIDIA Jetson Xavier NX Developer Kit\x00",
        "proc/device-tree/compatible": b"nvidia,p3509-0000+p3668-0001\x00nvidia,tegra194\x00",
        "etc/nv_tegra_release": (
            b"# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, "
            b"DATE: Tue Aug  1 19:57:35 UTC 2023\n"
        ),
        "dev/nvhost-ctrl-gpu": b"",
    },
}


def make_root(tmp_path: Path, board: str) -> Path:
    root = tmp_path / board
    for rel, data in BOARDS[board].items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


@pytest.mark.parametrize(
    ("board", "model", "l4t", "jetpack"),
    [
        ("orin-nano-jp6", "NVIDIA Jetson Orin Nano Developer Kit", "36.4.3", "6.2"),
        ("xavier-nx-jp5", "NVIDIA Jetson Xavier NX Developer Kit", "35.4.1", "5.1.2"),
    ],
)
def test_info_on_a_fake_jetson_root(tmp_path: Path, board: str, model: str, l4t: str, jetpack: str) -> None:
    root = make_root(tmp_path, board)
    result = run_cli("info", "--json", env={"EDGERT_SYSROOT": str(root)})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["jetson"] == {"is_jetson": True, "model": model, "l4t": l4t, "jetpack": jetpack}
    assert report["gpu"]["present"] is True
    assert report["backend"]["chosen"]  # whatever runs here, a backend is named with reasons
    text = run_cli("info", env={"EDGERT_SYSROOT": str(root)})
    assert f"{model}  L4T {l4t}  JetPack {jetpack}" in text.stdout


def test_cameras_and_power_mode_come_from_the_root(tmp_path: Path) -> None:
    root = make_root(tmp_path, "orin-nano-jp6")
    report = json.loads(run_cli("info", "--json", env={"EDGERT_SYSROOT": str(root)}).stdout)
    assert report["cameras"] == ["/dev/video0"]
    assert report["power_mode"]["mode"].startswith("pmode:0001")


def test_info_on_this_machine_names_the_backend_and_is_valid_json() -> None:
    result = run_cli("info", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"]["chosen"] in {c["name"] for c in report["backend"]["candidates"]}
    for key in ("system", "jetson", "gpu", "cuda", "tensorrt", "onnxruntime", "pycuda", "opencv"):
        assert key in report


def test_info_survives_an_unreadable_root(tmp_path: Path) -> None:
    root = tmp_path / "odd"
    (root / "etc/nv_tegra_release").mkdir(parents=True)  # a directory where a file should be
    result = run_cli("info", "--json", env={"EDGERT_SYSROOT": str(root)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["jetson"] == {"is_jetson": False}


@pytest.mark.parametrize(
    ("l4t", "jetpack"),
    [("36.4.3", "6.2"), ("36.3", "6.0"), ("35.6.0", "5.1.4"), ("32.7.4", "4.6.4"), ("38.2.0", "7.0"),
     ("36.9.9", "6.x")],
)
def test_l4t_to_jetpack(l4t: str, jetpack: str) -> None:
    assert jetpack_for_l4t(l4t) == jetpack
