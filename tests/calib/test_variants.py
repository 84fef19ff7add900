"""Copies of the calibration images in the range collection (calib_variants) and AdaRound's rounding,
on tiny real ONNX models: a variant that is not fed to the histograms, or a rounding not applied, fails here."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.calib.adaround import adaround, adaround_roundings
from edgert.calib.calibrate import CalibrationOptions, calibrate
from edgert.calib.qdq import quantize_weight
from edgert.calib.rounding import output_error
from edgert.calib.variants import degraded, with_variants
from edgert.errors import CalibrationError

from .models import check_roundings_carried, planned_on_random_feeds, tiny_detector, write_images

cv2 = pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")


def _edge_model(path: Path) -> Path:
    """x -> conv (a horizontal edge filter: + right, - left) -> Relu -> conv -> y: the Relu's output is large
    only where the image is darker left of an edge than right of it, so mirrored images change its range."""
    k = np.zeros((1, 3, 1, 3), np.float32)
    k[0, :, 0, 0], k[0, :, 0, 2] = -1.0, 1.0
    inits = [numpy_helper.from_array(k, "we"), numpy_helper.from_array(np.zeros(1, np.float32), "be"),
             numpy_helper.from_array(np.ones((2, 1, 1, 1), np.float32), "wo"),
             numpy_helper.from_array(np.zeros(2, np.float32), "bo")]
    nodes = [helper.make_node("Conv", ["images", "we", "be"], ["edge"], name="edge_conv"),
             helper.make_node("Relu", ["edge"], ["rising"], name="relu"),
             helper.make_node("Conv", ["rising", "wo", "bo"], ["y"], name="out_conv")]
    graph = helper.make_graph(nodes, "edge", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                          [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 32, 30])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _bright_left(folder: Path, n: int = 4) -> Path:
    """Images bright on the left half, dark on the right: a falling edge only (the Relu sees nothing)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        img = np.zeros((32, 32, 3), np.uint8)
        img[:, : 16 + i % 3] = 250
        cv2.imwrite(str(folder / f"{i}.png"), img)
    return folder


def test_mirrored_copies_reach_the_histograms(tmp_path: Path) -> None:
    model, images = _edge_model(tmp_path / "edge.onnx"), _bright_left(tmp_path / "imgs")

    def rising_amax(variants: tuple[str, ...]) -> float:
        report = calibrate(model, images, tmp_path / f"out{len(variants)}.onnx", progress=False,
                           options=CalibrationOptions(num=4, check=False, max_drop=None, equalization="none",
                                                      calib_variants=variants, force=True))
        return float(next(t for t in report["tensors"] if t["tensor"] == "rising")["amax"])

    # the photos alone only ever fall left to right: the Relu's range is ~0; mirrored, the edges rise
    assert rising_amax(()) < 1e-3
    assert rising_amax(("mirror",)) > 0.5
    with pytest.raises(CalibrationError, match="unknown calibration variant"):
        calibrate(model, images, tmp_path / "bad.onnx", progress=False,
                  options=CalibrationOptions(num=4, check=False, calib_variants=("sideways",)))


def test_with_variants_streams_the_images_then_one_copy_each_per_variant() -> None:
    rng = np.random.default_rng(0)
    imgs = [(Path(f"{i}.png"), rng.integers(0, 255, (48, 64, 3), np.uint8)) for i in range(3)]
    got = list(with_variants(iter(imgs), ("mirror", "mosaic3", "lowq")))
    assert len(got) == 3 * 4 and [g[0] for g in got[:3]] == [p for p, _ in imgs]
    np.testing.assert_array_equal(got[3][1], imgs[0][1][:, ::-1])
    assert all(img.shape == (48, 64, 3) and img.dtype == np.uint8 for _, img in got)
    low = degraded(imgs[0][1])
    assert 0 < np.abs(low.astype(int) - imgs[0][1]).mean() < 128  # softer and blocky, the same scene
    assert list(with_variants(iter(imgs), ())) == imgs


def test_adaround_lowers_a_random_layers_output_error_and_ends_binary() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    x = rng.standard_normal((4000, 72)) @ rng.standard_normal((72, 72))  # correlated inputs, as images give
    h = x.T @ x / len(x)
    near, scale = quantize_weight(w, 0)
    chosen = adaround(w, h, iters=200, rank=32)
    assert chosen.dtype == np.int8 and chosen.shape == w.shape and np.abs(chosen.astype(int)).max() <= 127
    floor = np.floor(w / scale.reshape(-1, 1, 1, 1))
    assert np.isin(chosen - floor, (0, 1)).all()  # every weight rounded down or up, never further
    s = scale.reshape(-1, 1, 1, 1)
    assert output_error(w, chosen * s, h) < 0.8 * output_error(w, near * s, h)


def test_adaround_on_a_model_is_what_the_qdq_model_carries(tmp_path: Path) -> None:
    model, plan, feeds, amax = planned_on_random_feeds(tmp_path)
    rounded, errors = adaround_roundings(model, plan, amax, lambda: iter(feeds), iters=100, per_image=64)
    check_roundings_carried(model, plan, amax, rounded, errors)
    with pytest.raises(CalibrationError, match="adaround_iters"):
        calibrate(tmp_path / "m.onnx", write_images(tmp_path / "imgs", 2)[0].parent, tmp_path / "q.onnx",
                  progress=False,
                  options=CalibrationOptions(rounding="adaround", adaround_iters=0, check=False))


def test_an_unknown_rounding_is_refused_before_any_image_is_read(tmp_path: Path) -> None:
    model = tiny_detector(tmp_path / "m.onnx")
    folder = tmp_path / "broken"
    folder.mkdir()
    for i in range(3):  # images no decoder reads: reaching them would end the run with another error
        (folder / f"{i}.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(CalibrationError, match=r"^unknown weight rounding 'bogus'; known: nearest, gptq, adaround$"):
        calibrate(model, folder, tmp_path / "q.onnx", progress=False, options=CalibrationOptions(rounding="bogus"))
    assert not (tmp_path / "q.onnx").exists()


def test_one_pass_on_the_equalised_model_gives_the_two_passes_ranges_and_cache(tmp_path: Path) -> None:
    model = tiny_detector(tmp_path / "m.onnx")
    images = write_images(tmp_path / "imgs", 6, size=(32, 32))[0].parent
    got = {}
    for once in (False, True):
        report = calibrate(model, images, tmp_path / f"q{once}.onnx", progress=False, options=CalibrationOptions(
            num=6, check=False, max_drop=None, collect_once=once, trt_version="10.3.0", force=True))
        assert report["equalization"]["rescaled_tensors"]  # conv1 -> relu -> conv2 is a region
        got[once] = ({t["tensor"]: t["amax"] for t in report["tensors"]},
                     (tmp_path / f"q{once}.calib").read_text().splitlines()[1:])
    (two, cache_two), (one, cache_one) = got[False], got[True]
    assert one.keys() == two.keys()
    assert all(abs(one[t] - two[t]) <= 1e-4 * max(two[t], 1e-6) for t in two)
    # the cache keeps the original model's own ranges (the tensors not rescaled: to float rounding)
    def scales(lines: list[str]) -> dict[str, float]:
        return {k: struct.unpack("!f", bytes.fromhex(v.strip()))[0] for k, v in (ln.rsplit(":", 1) for ln in lines)}

    a, b = scales(cache_one), scales(cache_two)
    assert a.keys() == b.keys() and all(abs(a[t] - b[t]) <= 1e-5 * b[t] for t in b)


def test_wider_ranges_take_the_larger_of_the_images_own_and_with_their_copies(tmp_path: Path) -> None:
    def ranges(model: Path, images: Path, variants: tuple[str, ...], how: str) -> dict[str, float]:
        report = calibrate(model, images, tmp_path / "q.onnx", progress=False, options=CalibrationOptions(
            num=4, check=False, max_drop=None, equalization="none", calib_variants=variants, variant_ranges=how,
            force=True))
        return {t["tensor"]: float(t["amax"]) for t in report["tensors"]}

    edge, falling = _edge_model(tmp_path / "edge.onnx"), _bright_left(tmp_path / "edges")
    mirrored = ranges(edge, falling, ("mirror",), "wider")
    assert mirrored["rising"] > 0.5  # widened by the mirrored copies, as "all" gives
    assert mirrored["rising"] == pytest.approx(ranges(edge, falling, ("mirror",), "all")["rising"])
    model = tiny_detector(tmp_path / "m.onnx")
    images = write_images(tmp_path / "imgs", 6, size=(32, 32))[0].parent
    alone, both = ranges(model, images, (), "all"), ranges(model, images, ("mosaic3", "lowq"), "all")
    wider = ranges(model, images, ("mosaic3", "lowq"), "wider")
    assert any(both[t] < alone[t] for t in alone)  # some range the copies narrow: wider keeps the images' own
    for t in alone:
        assert wider[t] == pytest.approx(max(alone[t], both[t]), abs=2e-6)
    with pytest.raises(CalibrationError, match="variant_ranges"):
        calibrate(model, images, tmp_path / "bad.onnx", progress=False,
                  options=CalibrationOptions(num=6, check=False, variant_ranges="narrower"))
