"""Image folders from the field: a decompression bomb, a name that is not UTF-8, a file OpenCV cannot read.

A 32000x32000 PNG of 150 KB (one bit a pixel, all zero) decoded to 3 GB of BGR, no warning: the OOM killer on an
8 GB board. A Latin-1 ``\\xe9t\\xe9.jpg`` made ``edgert run`` and ``edgert val`` die in ``cv2.imread`` (SIGSEGV,
rc 139) and ``calibrate`` with a traceback. Now the size is read from the header and checked against the pixel
budget before decoding (a folder skips and counts the image, a lone image is a one-line error), and every image
is decoded from its bytes. Every CLI process here runs under an address-space limit, so a decode that escaped the
budget fails the test instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.faults.conftest import summary_of
from tests.helpers import ROOT, assert_one_line_error

cv2 = pytest.importorskip("cv2", reason="the image tests decode real files (pip install opencv-python)")

LATIN1 = b"\xe9t\xe9.jpg"  # "été.jpg" as a Windows share or an SD card formatted elsewhere names it
_MEMORY = 3 << 30  # far below the 3 GB of BGR (plus the decoder's own copies) the bomb would need


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (_MEMORY, _MEMORY))

    return subprocess.run([sys.executable, "-m", "edgert.cli.main", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, **(env or {})}, preexec_fn=limit)


def _png_bomb(path: Path, side: int = 32000) -> Path:
    """A real PNG of ``side`` x ``side`` one-bit pixels, all black: a few hundred KB on disk."""
    row = b"\x00" + bytes((side + 7) // 8)
    compressor = zlib.compressobj(9)
    body = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


def _folder(root: Path) -> Path:
    folder = root / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        cv2.imwrite(str(folder / f"img{i}.jpg"), rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    ok, data = cv2.imencode(".jpg", rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    assert ok
    with open(os.path.join(os.fsencode(folder), LATIN1), "wb") as f:
        f.write(data.tobytes())
    (folder / "damaged.jpg").write_bytes(data.tobytes()[:120])
    _png_bomb(folder / "bomb.png")
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _folder(tmp_path_factory.mktemp("hostile"))


def test_a_run_on_the_folder_skips_and_counts(folder: Path, media: dict[str, Path]) -> None:
    r = _cli("run", "--model", str(media["model"]), "--source", str(folder), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = summary_of(r.stdout)
    assert summary["frames"] == 4  # three images and the one with the Latin-1 name
    assert summary["undecodable"] == {"image_too_large": 1, "unreadable_image": 1}, summary
    assert "32000x32000" in r.stderr and "EDGERT_MAX_IMAGE_PIXELS" in r.stderr


def test_a_lone_bomb_is_refused_in_one_line(folder: Path, media: dict[str, Path]) -> None:
    r = _cli("run", "--model", str(media["model"]), "--source", str(folder / "bomb.png"))
    assert_one_line_error(r, "bomb.png", "32000x32000", "over the budget", "EDGERT_MAX_IMAGE_PIXELS")


def test_the_budget_is_a_key(tmp_path: Path, media: dict[str, Path]) -> None:
    image = tmp_path / "wide.png"
    cv2.imwrite(str(image), np.zeros((300, 400, 3), np.uint8))
    low = _cli("run", "--model", str(media["model"]), "--source", str(image), env={"EDGERT_MAX_IMAGE_PIXELS": "1e5"})
    assert_one_line_error(low, "400x300", "over the budget")
    ok = _cli("run", "--model", str(media["model"]), "--source", str(image), env={"EDGERT_MAX_IMAGE_PIXELS": "2e5"})
    assert ok.returncode == 0, ok.stderr


def test_calibrate_skips_and_counts(folder: Path, tmp_path: Path, media: dict[str, Path]) -> None:
    out = tmp_path / "out" / "t.int8.onnx"
    r = _cli("calibrate", str(media["model"]), "--images", str(folder), "--num", "0", "--no-check",
             "--trt-version", "8.6.2", "-o", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert "skipped 2 file(s): 1 unreadable image(s), 0 not an image, 1 over the pixel budget" in r.stderr
    report = json.loads((tmp_path / "out" / "t.int8.report.json").read_text())
    assert report["images"]["used"] == 4 and report["images"]["skipped"] == 2


def test_val_skips_and_counts(folder: Path, tmp_path: Path, media: dict[str, Path]) -> None:
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "classes.txt").write_text("class0\nclass1\n")
    for name in (b"img0", b"img1", b"img2", LATIN1[:-4], b"damaged", b"bomb"):
        with open(os.path.join(os.fsencode(labels), name + b".txt"), "wb") as f:
            f.write(b"0 0.5 0.5 0.25 0.25\n")
    r = _cli("val", str(media["model"]), "--labels", str(labels), "--images", str(folder), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["images"] == 4, result
    assert result["labels"]["unreadable_images"] == 1 and result["labels"]["images_over_pixel_budget"] == 1


def test_val_refuses_a_polygon_row_in_one_line(folder: Path, tmp_path: Path, media: dict[str, Path]) -> None:
    """A segmentation label row (class and a polygon) used to be scored as a box from its first four numbers."""
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "classes.txt").write_text("class0\nclass1\n")
    (labels / "img0.txt").write_text("0 0.5 0.5 0.25 0.25\n")
    (labels / "img1.txt").write_text("1 0.1 0.1 0.9 0.1 0.9 0.9 0.1 0.9\n")
    r = _cli("val", str(media["model"]), "--labels", str(labels), "--images", str(folder))
    assert_one_line_error(r, "img1.txt:1", "segmentation polygon", "class cx cy w h")
