"""Preprocessing against a plain reference implementation, transforms, no per-frame allocation, bad input."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from edgert.config import PreprocessConfig
from edgert.errors import ConfigError, InputError, ModelError
from edgert.types import TensorSpec
from edgert.vision.preprocess import LetterboxTransform, Preprocessor, model_image_size

cv2 = pytest.importorskip("cv2")


def reference(frame: np.ndarray, cfg: PreprocessConfig, h: int, w: int, layout: str, dtype: str) -> np.ndarray:
    """What the preprocessing should produce, written the obvious way (Ultralytics' letterbox)."""
    fh, fw = frame.shape[:2]
    if cfg.resize == "letterbox":
        r = min(h / fh, w / fw)
        nw, nh = round(fw * r), round(fh * r)
        resized = cv2.resize(frame, (nw, nh), interpolation=cv2.INTER_LINEAR) if (nh, nw) != (fh, fw) else frame
        dw, dh = (w - nw) / 2, (h - nh) / 2
        top, bottom = round(dh - 0.1), round(dh + 0.1)
        left, right = round(dw - 0.1), round(dw + 0.1)
        pad = (cfg.pad_value,) * 3
        img = cv2.copyMakeBorder(resized, top, bottom, left, right, cv2.BORDER_CONSTANT, value=pad)
    else:
        img = cv2.resize(frame, (w, h), interpolation=cv2.INTER_LINEAR)
    if cfg.color == "rgb":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    x = (img.astype(np.float32) * np.float32(cfg.scale) - np.array(cfg.mean, np.float32)) / np.array(
        cfg.std, np.float32
    )
    if layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return x[None].astype(dtype)


def spec(layout: str, h: int, w: int, dtype: str = "float32") -> TensorSpec:
    shape = (1, 3, h, w) if layout == "NCHW" else (1, h, w, 3)
    return TensorSpec("images", shape, np.dtype(dtype))


@pytest.fixture(scope="module")
def frame() -> np.ndarray:
    rng = np.random.default_rng(0)
    # smooth content so resize differences stay small, plus noise so channel mix-ups show
    base = cv2.resize(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8), (160, 120), interpolation=cv2.INTER_CUBIC)
    return np.ascontiguousarray(base)


CASES = [
    # layout, dtype, config kwargs
    ("NCHW", "float32", {}),
    ("NHWC", "float32", {}),
    ("NCHW", "float32", {"color": "bgr"}),
    ("NHWC", "float32", {"color": "bgr", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}),
    ("NCHW", "float32", {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}),
    ("NHWC", "float32", {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}),
    ("NHWC", "float16", {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}),
    ("NCHW", "float16", {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "color": "bgr"}),
    ("NCHW", "float16", {}),
    ("NHWC", "float16", {"scale": 1.0}),
    ("NHWC", "uint8", {"scale": 1.0}),
    ("NCHW", "uint8", {"scale": 1.0, "color": "bgr"}),
    ("NCHW", "float32", {"resize": "stretch"}),
    ("NHWC", "float32", {"pad_value": 0, "scale": 1.0}),
]


@pytest.mark.parametrize(("layout", "dtype", "kwargs"), CASES)
@pytest.mark.parametrize(("h", "w"), [(96, 96), (64, 128), (128, 64)])
def test_matches_reference(frame: np.ndarray, layout: str, dtype: str, kwargs: dict, h: int, w: int) -> None:
    cfg = PreprocessConfig(**kwargs)
    pre = Preprocessor(cfg, spec(layout, h, w, dtype))
    out = pre.allocate()
    pre(frame, out)
    want = reference(frame, cfg, h, w, layout, dtype)
    assert out.shape == want.shape and out.dtype == want.dtype
    if dtype == "uint8":
        np.testing.assert_array_equal(out, want)
    else:
        tol = 2e-3 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize(("layout", "dtype", "kwargs"), [c for c in CASES if c[1] != "uint8"])
def test_numpy_fallback_matches_reference(frame: np.ndarray, layout: str, dtype: str, kwargs: dict) -> None:
    """The numpy path (kept for OpenCV builds without float16 arithmetic) gives the same input."""
    cfg = PreprocessConfig(**kwargs)
    pre = Preprocessor(cfg, spec(layout, 64, 96, dtype))
    pre._cv_depth, pre._cv_checked = None, True
    out = pre.allocate()
    pre(frame, out)
    tol = 2e-3 if dtype == "float16" else 1e-5
    want = reference(frame, cfg, 64, 96, layout, dtype).astype(np.float32)
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=tol, atol=tol)


def test_opencv_conversion_is_used_here() -> None:
    for dtype in ("float32", "float16"):
        pre = Preprocessor(PreprocessConfig(), spec("NCHW", 32, 32, dtype))
        pre(np.zeros((8, 8, 3), np.uint8), pre.allocate())
        assert pre._cv_depth is not None, f"OpenCV {cv2.__version__} fell back to numpy for {dtype}"


def test_frame_size_changes_repaint_padding(frame: np.ndarray) -> None:
    """A tall frame after a wide one: no stale pixels of the first frame remain in the padding."""
    cfg = PreprocessConfig(color="bgr", scale=1.0)
    pre = Preprocessor(cfg, spec("NHWC", 64, 64, "uint8"))
    out = pre.allocate()
    pre(np.full((32, 64, 3), 200, np.uint8), out)
    tall = np.full((64, 32, 3), 10, np.uint8)
    pre(tall, out)
    np.testing.assert_array_equal(out, reference(tall, cfg, 64, 64, "NHWC", "uint8"))
    pre(frame, out)  # and back to the module's 160x120 frame
    np.testing.assert_array_equal(out, reference(frame, cfg, 64, 64, "NHWC", "uint8"))


def test_transform_maps_boxes_back(frame: np.ndarray) -> None:
    pre = Preprocessor(PreprocessConfig(), spec("NCHW", 64, 64))
    tr = pre(frame, pre.allocate())  # 160x120 -> 64x48 inside 64x64, 8 px bars top and bottom
    assert tr == LetterboxTransform(scale_x=0.4, scale_y=0.4, pad_x=0.0, pad_y=8.0, src_width=160, src_height=120)
    boxes = np.array([[0, 8, 64, 56], [10, 20, 30, 40], [-5, 0, 70, 64]], np.float32)
    got = tr.to_original(boxes.copy())
    np.testing.assert_allclose(got, [[0, 0, 160, 120], [25, 30, 75, 80], [0, 0, 160, 120]], atol=1e-4)
    np.testing.assert_allclose(tr.to_input(np.array([[25, 30, 75, 80]])), [[10, 20, 30, 40]], atol=1e-4)


def test_stretch_transform(frame: np.ndarray) -> None:
    pre = Preprocessor(PreprocessConfig(resize="stretch"), spec("NCHW", 60, 80))
    tr = pre(frame, pre.allocate())
    assert (tr.scale_x, tr.scale_y, tr.pad_x, tr.pad_y) == (0.5, 0.5, 0.0, 0.0)


def test_no_per_frame_allocation(assets) -> None:  # type: ignore[no-untyped-def]
    cap = cv2.VideoCapture(str(assets / "video" / "vtest.avi"))
    frames = [cap.read()[1] for _ in range(5)]
    cap.release()
    for layout, dtype in (("NCHW", "float32"), ("NHWC", "float16")):
        pre = Preprocessor(PreprocessConfig(), spec(layout, 416, 416, dtype))
        out = pre.allocate()
        address = out.ctypes.data
        first = pre(frames[0], out)  # the first frame of a size makes the scratch buffers
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            for i in range(50):
                tr = pre(frames[i % len(frames)], out)
            after, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert tr is first  # the same transform object for every frame of one size
        assert out.ctypes.data == address
        assert after - before < 2048, f"{layout} {dtype}: grew {after - before} bytes over 50 frames"
        # no frame-sized temporaries either (a 416x416x3 float32 would be 2 MB)
        assert peak - before < 128 * 1024, f"{layout} {dtype}: peak {peak - before} bytes"


def test_size_from_ultralytics_metadata() -> None:
    dyn = TensorSpec("images", (1, 3, "height", "width"), np.dtype(np.float32))
    pre = Preprocessor(PreprocessConfig(), dyn, {"imgsz": "[480, 640]"})
    assert pre.input_shape == (1, 3, 480, 640)
    assert model_image_size({"imgsz": "320"}) == (320, 320)
    assert model_image_size({"imgsz": "nonsense"}) is None
    pre = Preprocessor(PreprocessConfig(size=(256, 320)), dyn)
    assert pre.input_shape == (1, 3, 256, 320)
    with pytest.raises(ConfigError, match=r"preprocess.size"):
        Preprocessor(PreprocessConfig(), dyn)
    # a dynamic Ultralytics model takes multiples of its stride: rounded up, as Ultralytics does
    pre = Preprocessor(PreprocessConfig(size=(250, 330)), dyn, {"stride": "32"})
    assert pre.input_shape == (1, 3, 256, 352)


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((10, 10), np.uint8),
        np.zeros((10, 10, 4), np.uint8),
        np.zeros((10, 10, 3), np.float32),
        np.zeros((0, 10, 3), np.uint8),
        [[1, 2, 3]],
    ],
    ids=["gray", "bgra", "float", "empty", "list"],
)
def test_bad_frame_is_one_line_input_error(bad: object) -> None:
    pre = Preprocessor(PreprocessConfig(), spec("NCHW", 32, 32))
    with pytest.raises(InputError) as info:
        pre(bad, pre.allocate())  # type: ignore[arg-type]
    assert "\n" not in str(info.value) and "expected" in str(info.value)


def test_wrong_output_buffer() -> None:
    pre = Preprocessor(PreprocessConfig(), spec("NCHW", 32, 32))
    with pytest.raises(InputError, match="expected float32"):
        pre(np.zeros((8, 8, 3), np.uint8), np.zeros((1, 3, 32, 32), np.float16))


def test_config_that_does_not_fit_the_model() -> None:
    with pytest.raises(ConfigError, match="raw pixels"):
        Preprocessor(PreprocessConfig(), spec("NHWC", 32, 32, "uint8"))  # uint8 input but scale 1/255
    with pytest.raises(ConfigError, match="does not fit"):
        Preprocessor(PreprocessConfig(size=(64, 64)), spec("NCHW", 32, 32))
    with pytest.raises(ConfigError, match="does not fit"):
        Preprocessor(PreprocessConfig(dtype="float16"), spec("NCHW", 32, 32))
    with pytest.raises(ConfigError, match="does not fit"):
        Preprocessor(PreprocessConfig(layout="NHWC"), spec("NCHW", 32, 32))
    with pytest.raises(ModelError, match="rank 4"):
        Preprocessor(PreprocessConfig(), TensorSpec("x", (1, 16), np.dtype(np.float32)))
    with pytest.raises(ModelError, match="colour channels"):
        Preprocessor(PreprocessConfig(), TensorSpec("x", (1, 4, 32, 32), np.dtype(np.float32)))
