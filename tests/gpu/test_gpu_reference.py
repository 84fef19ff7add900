"""CPU-runnable checks of the GPU pipeline: the memory-mode choice, and the numpy references of the
CUDA kernels (letterbox.cu, decode.cu) against OpenCV and the CPU decoders on the real assets.

The kernels do, element for element, what ``emulate_letterbox`` / ``emulate_filter`` do (the device
test checks that on the GPU); these tests pin the references to the CPU path, so the GPU path is
checked against the CPU path transitively, here, without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgert.config import DecodeConfig, FieldError, PreprocessConfig, RuntimeConfig
from edgert.errors import ConfigError, ModelError
from edgert.pipeline.gpu import choose_memory_mode
from edgert.types import TensorSpec
from edgert.vision.gpu_decode import candidates_to_detections, emulate_filter, filter_layout
from edgert.vision.gpu_preprocess import LetterboxPlan, emulate_letterbox, kernel_source, linear_tables

cv2 = pytest.importorskip("cv2")


# -- memory mode ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requested", "integrated", "can_map", "expected"),
    [
        ("auto", True, True, "zero-copy"),  # Jetson: same DRAM, mapped memory costs nothing
        ("auto", True, False, "pinned"),
        ("auto", False, True, "pinned"),  # discrete GPU: mapped memory would go over PCIe
        ("auto", False, False, "pinned"),
        ("pinned", True, True, "pinned"),
        ("zero-copy", False, True, "zero-copy"),  # allowed (the H200 measurement), just slower
        ("zero-copy", True, True, "zero-copy"),
    ],
)
def test_choose_memory_mode(requested: str, integrated: bool, can_map: bool, expected: str) -> None:
    assert choose_memory_mode(requested, integrated, can_map) == expected


def test_zero_copy_refused_without_mapping() -> None:
    with pytest.raises(ConfigError, match=r"cannot map host memory.*--memory pinned"):
        choose_memory_mode("zero-copy", integrated=True, can_map=False)


def test_unknown_memory_mode_and_bad_options() -> None:
    with pytest.raises(ConfigError, match="not one of auto, pinned, zero-copy"):
        choose_memory_mode("mapped", True, True)
    with pytest.raises(FieldError, match=r"expected 1\.\.16, got 0"):
        RuntimeConfig(slots=0)


# -- letterbox reference vs OpenCV ------------------------------------------------------------------------
def _images(assets: Path) -> list[np.ndarray]:
    imgs = [cv2.imread(str(p)) for p in sorted((assets / "images").glob("*")) if p.suffix in (".jpg", ".png")]
    cap = cv2.VideoCapture(str(assets / "video" / "vtest.avi"))
    ok, frame = cap.read()
    cap.release()
    if ok:
        imgs.append(frame)
    return [im for im in imgs if im is not None]


def _resize_reference(img: np.ndarray, new_w: int, new_h: int) -> np.ndarray:
    """Only the resize part of emulate_letterbox (pad 0, identity conversion, uint8 NHWC BGR)."""
    plan = LetterboxPlan(new_h, new_w, "NHWC", np.dtype(np.uint8), False, 0, (0, 1, 2), (1.0,) * 3, (0.0,) * 3)
    return emulate_letterbox(img, plan)


def test_linear_tables_match_opencv_formula() -> None:
    # 768 -> 416 (vtest.avi into nanodet): fx = (d + 0.5) * 768/416 - 0.5
    t = linear_tables(768, 416, 3)
    assert t.shape == (416, 4) and t.dtype == np.int32
    assert (t[:, 2] + t[:, 3] == 2048).all()  # weights of a tap pair always sum to one (2048)
    assert (t[:, 0] % 3 == 0).all() and t[:, 1].max() <= 767 * 3
    assert t[0].tolist() == [0, 3, 1182, 866]  # fx = 0.5 * 768 / 416 - 0.5 = 0.423: round(0.577 * 2048), ...
    up = linear_tables(512, 640)  # upscale: the first row reads row 0 twice with the raw weights
    assert up[0, 0] == 0 and up[0, 1] == 0 and up[0, 2] == 205 and up[0, 3] == 1843


def test_resize_reference_is_bit_exact_with_cv2(assets: Path) -> None:
    """Downscale and upscale, every asset image: the kernel's arithmetic equals cv2.resize(INTER_LINEAR)."""
    worst = 0
    checked = 0
    images = _images(assets)
    if len(images) < 40:  # the full assets folder has 40 images (PNG too) and a vtest frame
        pytest.skip(f"{len(images)} images in {assets}: the reference check needs every asset image")
    for img in images:
        h, w = img.shape[:2]
        for dst in (416, 640, 1000):
            r = min(dst / h, dst / w)
            nw, nh = max(1, min(dst, round(w * r))), max(1, min(dst, round(h * r)))
            ref = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
            got = _resize_reference(img, nw, nh)
            worst = max(worst, int(np.abs(ref.astype(int) - got.astype(int)).max()))
            checked += 1
    assert checked >= 120
    assert worst == 0, f"max difference {worst} grey levels"


@pytest.mark.parametrize(
    ("cfg", "shape", "dtype"),
    [
        (PreprocessConfig(), (1, 3, 416, 416), np.float32),  # nanodet
        (PreprocessConfig(), (1, 3, 640, 640), np.float32),  # yolov8s
        (
            PreprocessConfig(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), color="bgr"),
            (1, 320, 256, 3),
            np.float16,
        ),
        (PreprocessConfig(scale=1.0, resize="stretch"), (1, 3, 300, 300), np.uint8),
        (PreprocessConfig(pad_value=0, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)), (1, 3, 640, 640), np.float16),
        (PreprocessConfig(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), (1, 3, 416, 416), np.float32),
    ],
)
def test_letterbox_reference_matches_cpu_preprocessor(
    assets: Path, cfg: PreprocessConfig, shape: tuple[int, ...], dtype: type
) -> None:
    from edgert.vision.preprocess import Preprocessor

    pre = Preprocessor(cfg, TensorSpec("images", shape, np.dtype(dtype)))
    plan = LetterboxPlan.from_preprocessor(pre)
    worst = 0.0
    for img in _images(assets)[::3]:
        out = pre.allocate()
        pre(img, out)
        emu = emulate_letterbox(img, plan)
        worst = max(worst, float(np.abs(out[0].astype(np.float64) - emu.astype(np.float64)).max()))
    # Without a mean: exact. With a mean, the CPU path may convert with OpenCV's addWeighted (one rounding
    # of x * alpha + beta) where the kernel rounds after the multiply and after the add, as numpy does:
    # at most one float32 ulp (about 2.4e-7 here) or one float16 step.
    has_mean = any(m != 0 for m in cfg.mean)
    tol = 4e-3 if dtype == np.float16 else (1e-6 if has_mean else 0.0)
    assert worst <= tol


def test_plan_follows_the_preprocessor() -> None:
    from edgert.vision.preprocess import Preprocessor

    pre = Preprocessor(PreprocessConfig(), TensorSpec("images", (1, 3, 640, 640), np.dtype(np.float32)))
    plan = LetterboxPlan.from_preprocessor(pre)
    assert (plan.height, plan.width, plan.layout, plan.pad, plan.src_channel) == (640, 640, "NCHW", 114, (2, 1, 0))
    new_h, new_w, top, left, t = plan.geometry(576, 768)
    assert (new_h, new_w, top, left) == (480, 640, 80, 0)
    assert t.scale_x == pytest.approx(640 / 768) and t.pad_y == 80.0


def test_kernel_sources_are_packaged() -> None:
    assert "edgert_letterbox" in kernel_source("letterbox.cu")
    src = kernel_source("decode.cu")
    assert "edgert_filter_yolov8" in src and "edgert_filter_yolov5" in src and "edgert_take_count" in src


# -- decode reference vs the CPU decoders -----------------------------------------------------------------
@pytest.mark.parametrize(
    "model",
    ["nanodet-m-416-coco-v8layout.onnx", "yolov8s-fall-640.onnx", "yolov3-tiny-coco-416.onnx"],
)
def test_filter_reference_gives_the_cpu_decoders_detections(assets: Path, model: str) -> None:
    from edgert.vision.detector import Detector

    path = assets / "models" / "detection" / model
    if not path.exists():
        pytest.skip(f"{model} is not in this assets folder ({assets})")
    with Detector(path, backend="onnxruntime") as det:
        for name in ("bus.jpg", "zidane.jpg"):
            if not (assets / "images" / name).is_file():
                pytest.skip(f"images/{name} is not in this assets folder ({assets})")
            img = cv2.imread(str(assets / "images" / name))
            t = det.preprocess(img)
            outs = det.session.infer()
            ref = det.decoder(outs, t)
            rows = emulate_filter(outs[det.decoder.output], det.decoder.kind, det.config.decode.conf)  # type: ignore[attr-defined]
            assert 0 < len(ref) <= rows.shape[0]
            got = candidates_to_detections(rows[::-1].copy(), det.decoder, t)  # any row order: atomics
            assert np.array_equal(got.xyxy, ref.xyxy)
            assert np.array_equal(got.class_id, ref.class_id)
            assert np.array_equal(got.confidence, ref.confidence)


def test_filter_reference_yolov5_threshold_semantics() -> None:
    # two anchors, 2 classes: obj passes but obj*cls does not (anchor 0); both pass (anchor 1)
    out = np.zeros((1, 3, 7), np.float32)
    out[0, 0] = [10, 10, 4, 4, 0.5, 0.4, 0.3]  # best 0.2 < 0.25: dropped
    out[0, 1] = [20, 20, 4, 4, 0.9, 0.1, 0.8]  # class 1, 0.72
    out[0, 2] = [30, 30, 4, 4, 0.2, 1.0, 1.0]  # objectness 0.2: dropped before the classes
    rows = emulate_filter(out, "yolov5", 0.25)
    assert rows.shape == (1, 8)
    assert rows[0, 5] == 1 and rows[0, 6] == 1 and rows[0, 4] == pytest.approx(0.72)


def test_filter_layout_rejects_other_shapes() -> None:
    assert filter_layout("yolov8", (1, 84, 3549)) == (80, 3549)
    assert filter_layout("yolov5", (1, 2535, 85)) == (80, 2535)
    with pytest.raises(ModelError, match="yolov8 GPU decoding needs"):
        filter_layout("yolov8", (1, 4, 100))
    with pytest.raises(ModelError, match="supports yolov8, yolov5"):
        filter_layout("end2end", (1, 100, 6))
    assert DecodeConfig().conf == 0.25  # the threshold the kernels receive as float32
