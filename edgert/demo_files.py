"""Files to try every command on, made from the data the package carries: no download, no ``../shared``.

``edgert/demo_data`` holds NanoDet-m with INT8 weights (3.9 MB), a 20 s clip of OpenCV's pedestrian video and
the labels of eight of its frames. From those, once, into the user cache (``$EDGERT_CACHE_DIR/demo``, else
``~/.cache/edgert/demo``):

- ``nanodet-m-416.onnx``: an FP32 model, the INT8 weights multiplied back by their scales (what ``calibrate``,
  ``convert`` and ``rebatch`` take; it detects what the packaged model detects);
- ``photos/``: eight frames of the clip as JPEG (``calibrate --images``, ``run --source``, ``compare``);
- ``val/images`` and ``val/labels.json``: those frames with COCO labels (``edgert val``; how the labels were
  made is in ``edgert/demo_data/LICENSES``);
- ``street.mp4``: the clip.

    files = demo_files()         # DemoFiles(model=..., photos=..., val_images=..., val_labels=..., video=...)

``edgert demo --files DIR`` copies them where a user wants them.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from edgert.errors import ConfigError

__all__ = ["DemoFiles", "demo_files", "packaged_data"]

PACKAGED_MODEL = "nanodet-m-416-int8w.onnx"
PACKAGED_VIDEO = "vtest-384x288.mp4"
VAL_LABELS = "val-labels.json"
FP32_MODEL = "nanodet-m-416.onnx"


@dataclass(frozen=True)
class DemoFiles:
    """Where the demo files are (all made; see the module doc)."""

    folder: Path
    model: Path
    photos: Path
    val_images: Path
    val_labels: Path
    video: Path

    def photo_paths(self) -> list[Path]:
        return sorted(self.photos.glob("*.jpg"))


def packaged_data() -> Path:
    """The folder of the demo data inside the package (a plain folder: wheels and editable installs unpack)."""
    return Path(__file__).resolve().parent / "demo_data"


def _cache_root() -> Path:
    base = os.environ.get("EDGERT_CACHE_DIR")
    return Path(base) / "demo" if base else Path.home() / ".cache" / "edgert" / "demo"


def dequantize_weights(src: Path, dst: Path) -> None:
    """``src`` with every DequantizeLinear of a constant (INT8 weights, per-channel scales) replaced by the
    float32 weights it computes: a plain FP32 model."""
    import onnx

    from edgert.onnx_dequantize import dequantized

    model = dequantized(onnx.load(str(src)), activations=False)
    for prop in model.metadata_props:
        if prop.key == "edgert_demo":
            prop.value = "NanoDet-m COCO, FP32 weights rebuilt from the packaged INT8 ones (edgert.demo_files)"
    onnx.checker.check_model(model)
    tmp = dst.with_name(dst.name + ".part")
    onnx.save(model, str(tmp))
    os.replace(tmp, dst)


def _frames(video: Path, indices: list[int], out: Path) -> list[Path]:
    from edgert._lazy import lazy_import

    cv2 = lazy_import("cv2", "the demo photos")
    out.mkdir(parents=True, exist_ok=True)
    cap = cv2.VideoCapture(str(video))
    wanted, written, index = set(indices), [], 0
    try:
        while wanted:
            ok, frame = cap.read()
            if not ok:
                break
            if index in wanted:
                path = out / f"vtest-{index:03d}.jpg"
                cv2.imwrite(str(path), frame, [cv2.IMWRITE_JPEG_QUALITY, 95])
                written.append(path)
                wanted.discard(index)
            index += 1
    finally:
        cap.release()
    if wanted:
        raise ConfigError(f"{video}: frames {sorted(wanted)} could not be read. Note: reinstall edgert")
    return written


def demo_files(folder: str | Path | None = None) -> DemoFiles:
    """The demo files in ``folder`` (default: the user cache), made there unless they already are."""
    data = packaged_data()
    for name in (PACKAGED_MODEL, PACKAGED_VIDEO, VAL_LABELS):
        if not (data / name).is_file():
            raise ConfigError(f"{data}: the packaged demo data is missing {name}. Note: reinstall edgert")
    root = Path(folder) if folder is not None else _cache_root()
    files = DemoFiles(root, root / FP32_MODEL, root / "photos", root / "val" / "images", root / "val" / "labels.json",
                      root / "street.mp4")
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not files.model.is_file():
            dequantize_weights(data / PACKAGED_MODEL, files.model)
        if not files.video.is_file():
            shutil.copyfile(data / PACKAGED_VIDEO, files.video)
        labels = json.loads((data / VAL_LABELS).read_text(encoding="utf-8"))
        indices = [int(im["frame"]) for im in labels["images"]]
        if len(list(files.photos.glob("*.jpg"))) < len(indices):
            _frames(data / PACKAGED_VIDEO, indices, files.photos)
        if not files.val_labels.is_file() or len(list(files.val_images.glob("*.jpg"))) < len(indices):
            files.val_images.mkdir(parents=True, exist_ok=True)
            for path in files.photo_paths():
                shutil.copyfile(path, files.val_images / path.name)
            files.val_labels.write_text(json.dumps(labels, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{root}: cannot write the demo files: {exc.strerror or exc}. Note: set "
                          "EDGERT_CACHE_DIR to a writable folder, or pass another folder") from None
    return files
