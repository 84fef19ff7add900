"""The check set of the mixed-precision pass (calibration images and copies of them) and shared INT8 ranges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.calib.check import check_frames as _check_frames
from edgert.calib.collect import ActivationCollector
from edgert.calib.dataset import CalibrationImages
from edgert.calib.qdq import plan_quantization, prepare_model, shared_ranges, write_qdq
from edgert.calib.variants import mosaic as _mosaic
from edgert.errors import CalibrationError

from .models import write_images

cv2 = pytest.importorskip("cv2")
ort = pytest.importorskip("onnxruntime")


def _drawn(folder: Path, num: int) -> CalibrationImages:
    ds = CalibrationImages(folder, num=num, seed=0)
    list(ds)  # the draw: ds.used is what calibration took
    return ds


def test_check_set_is_the_calibration_images_and_one_copy_each_per_variant(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 8, size=(60, 80))
    ds = _drawn(folder, 6)
    frames, where = _check_frames(folder, ds, 4, None, 0, variants=("mirror", "half", "mosaic", "mosaic3"))
    assert len(frames) == 4 * 5  # 4 images, then one copy of each per variant
    assert all(f.shape == (60, 80, 3) and f.dtype == np.uint8 for f in frames)
    np.testing.assert_array_equal(frames[4], frames[0][:, ::-1])  # mirrored
    assert "2x2 mosaics" in where and "3x3 mosaics" in where and "4 calibration images" in where
    # never more than `count` images decoded, whatever the number of calibration images
    frames, _ = _check_frames(folder, ds, 2, None, 0, variants=("mosaic3",))
    assert len(frames) == 4
    # only images calibration used: none of the two the folder has beyond them
    used = {p.resolve() for p in ds.used}
    again = CalibrationImages(folder, num=6, seed=0)
    firsts = [img for _, img in again]
    assert all(p.resolve() in used for p in again.used)
    np.testing.assert_array_equal(frames[0], firsts[0])
    with pytest.raises(CalibrationError, match="unknown image variant"):
        _check_frames(folder, ds, 2, None, 0, variants=("sideways",))


def test_mosaic_tiles_shrunk_images_keeping_their_aspect() -> None:
    a = np.full((40, 80, 3), 10, np.uint8)  # wide
    b = np.full((80, 40, 3), 200, np.uint8)  # tall
    m = _mosaic([a, b], 0, 2)
    assert m.shape == (40, 80, 3)  # the first image's size
    assert (m[:20, :40] == 10).all()  # a: 80x40 into a 40x20 cell, exactly
    assert (m[:20, 40:50] == 200).all() and (m[:20, 50:80] == 114).all()  # b: 10 wide in its 40x20 cell, grey beside
    assert (m[20:, :40] == 10).all()  # the third tile wraps around to a
    m3 = _mosaic([a, b], 1, 3)
    assert m3.shape == (80, 40, 3)  # starting at b: b's size


def _concat_model(path: Path) -> Path:
    """x -> conv a, conv b (b scaled up 4x) -> Concat -> conv c; conv a -> MaxPool -> conv d; c + d -> y."""
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [w("wa", 4, 3, 3, 3), w("wb", 4, 3, 3, 3, scale=1.2), w("wc", 4, 8, 1, 1), w("wd", 4, 4, 1, 1)]
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "b"], ["ab"], name="concat", axis=1),
        helper.make_node("Conv", ["ab", "wc"], ["c"], name="conv_c"),
        helper.make_node("MaxPool", ["a"], ["pa"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["pa", "wd"], ["d"], name="conv_d"),
        helper.make_node("Add", ["c", "d"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_concat_and_maxpool_neighbours_share_one_range(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(_concat_model(tmp_path / "m.onnx"))))
    plan = plan_quantization(model)
    assert {"a", "ab", "pa"} <= set(plan.quantized_tensors)  # conv_a's input is x; a feeds the pool
    col = ActivationCollector(model, [t for t in plan.activation_tensors if t not in plan.tail_tensors])
    rng = np.random.default_rng(1)
    for _ in range(4):
        col.update(rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32))
    amax = {n: h.amax("minmax") for n, h in col.histograms.items()}
    assert amax["b"] > amax["a"]  # b's weights are 4x larger: the group's range is b's
    shared = shared_ranges(model, plan, amax)
    group = max(amax["a"], amax["b"], amax["ab"], amax["pa"])
    assert shared["a"] == shared["b"] == shared["ab"] == shared["pa"] == pytest.approx(group)
    assert shared["x"] == amax["x"]  # not in a group
    only_pool = shared_ranges(model, plan, amax, ops=("MaxPool",))
    assert only_pool["a"] == only_pool["pa"] == max(amax["a"], amax["pa"]) and only_pool["ab"] == amax["ab"]
    # the written model runs, and the MaxPool path rounds once: pool(QDQ(a)) is on the grid conv_d reads
    qdq = write_qdq(model, plan, shared)
    scales = {i.name: float(numpy_helper.to_array(i)) for i in qdq.graph.initializer if i.name.endswith("_scale")
              and not i.dims}
    assert scales["a_scale"] == scales["pa_scale"] == scales["ab_scale"]
    sess = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    out = sess.run(None, {"x": rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)})[0]
    assert out.shape == (1, 4, 8, 8) and np.isfinite(out).all()


def test_the_verdict_fails_on_a_collapse_whatever_was_asked() -> None:
    from edgert.calib.check import verdict
    from edgert.calib.options import CalibrationOptions

    def acc(value: float, per_class: dict[str, float], boxes: dict[str, int]) -> dict[str, object]:
        return {"map": {"map50_95": value, "per_class": per_class, "per_class_boxes": boxes}}

    default = CalibrationOptions()
    fine = verdict(acc(0.85, {"0": 0.85}, {"0": 40}), default, 0.9)
    assert fine["met"] is False and not fine["failed"] and not fine["collapse"]  # the default target: a figure
    given = verdict(acc(0.85, {"0": 0.85}, {"0": 40}), CalibrationOptions(max_drop=0.05, max_drop_given=True), 0.9)
    assert given["failed"] and not given["collapse"]
    broken = verdict(acc(0.08, {"0": 0.08}, {"0": 40}), CalibrationOptions(max_drop=None), 1.0)
    assert broken["collapse"] and broken["failed"] and "< 0.1" in broken["why"]
    lost = verdict(acc(0.9, {"0": 0.95, "15": 0.0}, {"0": 40, "15": 12}), default, 0.9)
    assert lost["collapse"] and "15" in lost["why"]
    rare = verdict(acc(0.9, {"0": 0.95, "15": 0.0}, {"0": 40, "15": 1}), default, 0.9)
    assert not rare["collapse"]  # one cat missed is a loss, not a collapse
