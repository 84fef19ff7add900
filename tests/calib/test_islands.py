"""The default mixed-precision pass: one-pass layer errors, a MAC budget, reasons, the verdict and exit status."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgert.calib.calibrate import CalibrationOptions, calibrate
from edgert.calib.layer_error import layer_errors
from edgert.calib.macs import count_macs
from edgert.calib.qdq import plan_quantization, prepare_model, write_qdq
from edgert.calib.sensitivity import output_layers, rank_candidates
from edgert.rewrite.graph import activation_graph
from tests.helpers import run_cli

from .models import tiny_detector, write_images

pytest.importorskip("cv2")
ort = pytest.importorskip("onnxruntime")


def _feeds(n: int, size: int = 32) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"images": rng.uniform(0, 1, (1, 3, size, size)).astype(np.float32)} for _ in range(n)]


def test_layer_errors_in_one_pass_match_one_layer_quantized_alone(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "d.onnx", residual=True))))
    plan = plan_quantization(model)
    amax = {t: 1.0 for t in plan.activation_tensors}
    amax["r1"] = 0.05  # conv2 reads a badly clipped input
    errs = layer_errors(model, plan, amax, _feeds(2))
    assert set(errs) == {t.node for t in plan.targets}
    assert all(np.isfinite(v) and v >= 0 for v in errs.values())
    assert max(errs, key=errs.__getitem__) == "conv2"

    # the same figure by hand for conv2: its output with only it in INT8, against FP32, on exact inputs
    others = [t.node for t in plan.targets if t.node != "conv2"]
    qdq = write_qdq(model, plan, amax, exclude_nodes=others)
    for m in (model, qdq):
        m.graph.output.append(onnx.ValueInfoProto(name="c2"))
    ref = ort.InferenceSession(model.SerializeToString())
    one = ort.InferenceSession(qdq.SerializeToString())
    err = sig = 0.0
    for feed in _feeds(2):
        a, b = ref.run(["c2"], feed)[0], one.run(["c2"], feed)[0]
        err += float(((b - a) ** 2).sum())
        sig += float((a ** 2).sum())
    assert errs["conv2"] == pytest.approx(err / sig, rel=1e-3)


def test_ranking_is_error_per_mac_with_the_output_region_as_one_candidate() -> None:
    scores = {"big": 0.5, "cheap": 0.1, "head": 0.01, "head2": 0.01, "pool": 0.2}
    macs = {"big": 1000, "cheap": 10, "head": 5, "head2": 5, "pool": 0}
    ranked = rank_candidates(scores, macs, budget=100, region=["head", "head2"])
    # per MAC: pool 0.2 / 5 (as the cheapest layer) = 0.04; region 2 x 0.02 / 10 = 0.004, cheap 0.01; big 0.0005
    assert [n for n, _ in ranked] == ["pool", "cheap", "head", "head2", "big"]
    reasons = dict(ranked)
    assert "output layer" in reasons["head"] and "rank 3" in reasons["head2"] and "% of MACs" in reasons["cheap"]
    # with more error the region goes first, as one unit
    scores.update(head=1.0, head2=1.0)
    assert [n for n, _ in rank_candidates(scores, macs, budget=100, region=["head", "head2"])][:2] == ["head", "head2"]
    # a region dearer than the budget is ranked layer by layer
    assert "output layer" not in dict(rank_candidates(scores, macs, budget=1, region=["big"]))["big"]


def test_weight_bytes_in_the_ranking_put_the_layer_with_fewer_weights_first() -> None:
    # equal error per MAC; "deep" holds 90 % of the weights (a 20x20 3x3 conv: few MACs, many weights)
    scores = {"deep": 0.2, "wide": 0.2}
    macs = {"deep": 100, "wide": 100}
    weights = {"deep": 9000, "wide": 1000}
    by_mac = [n for n, _ in rank_candidates(scores, macs, budget=1000, weights=weights)]
    assert sorted(by_mac) == ["deep", "wide"]  # a tie without the size term
    ranked = rank_candidates(scores, macs, budget=1000, weights=weights, size_weight=1.0)
    assert [n for n, _ in ranked] == ["wide", "deep"]
    assert "90.00 % of weights" in dict(ranked)["deep"] and "error per cost rank 2" in dict(ranked)["deep"]
    # the size term only breaks ties it should: a layer with 10x the error per MAC still goes first
    scores["deep"] = 2.0
    assert rank_candidates(scores, macs, 1000, weights=weights, size_weight=1.0)[0][0] == "deep"


def test_output_layers_are_the_convs_that_feed_the_tail(tmp_path: Path) -> None:
    model = prepare_model(onnx.load(str(tiny_detector(tmp_path / "d.onnx", residual=True))))
    assert output_layers(model, plan_quantization(model)) == ["head_conv"]


def test_the_tail_is_one_definition_even_with_nothing_to_anchor_on() -> None:
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[2, 2]),
         helper.make_node("Sigmoid", ["p"], ["y"], name="sig")], "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])])
    model = prepare_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    plan = plan_quantization(model)
    assert plan.tail_nodes == activation_graph(model).tail_nodes == []
    assert plan.tail_tensors == activation_graph(model).tail_tensors == set()
    assert [t.node for t in plan.targets] == ["pool"]  # no tail: the pool is body, and quantized


def test_default_names_each_float_layer_with_its_reason_and_keeps_the_mac_budget(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 4, size=(64, 64))
    model = tiny_detector(tmp_path / "det.onnx", size=64, residual=True)
    out = tmp_path / "det.int8.onnx"
    # a target INT8 cannot reach (mAP 1.0 exactly), so the pass runs and hands back what the budget allows
    opts = CalibrationOptions(num=4, max_drop=0.0, max_float=0.5, check_frames=4, score_frames=2,
                              check_variants=("mirror",))
    report = calibrate(model, folder, out, options=opts, progress=False)
    sens = report["sensitivity"]
    assert sens is not None and sens["float_layers"], report.get("accuracy")
    for node in sens["float_layers"]:
        why = report["float_layers"][node]
        assert why.startswith("sensitivity: ") and "MACs" in why
    layers = count_macs(prepare_model(onnx.load(str(model)))).layers
    floated = sum(layers.get(n, 0) for n in sens["float_layers"])
    assert floated <= 0.5 * sum(layers.values())
    assert report["macs"]["int8_share"] >= 0.5 - 1e-9
    assert report["summary"]["int8_mac_share"] == report["macs"]["int8_share"]
    assert count_macs(onnx.load(str(out))).share == pytest.approx(report["macs"]["int8_share"], abs=1e-4)
    v = report["verdict"]
    assert v["target"] == 1.0 and v["met"] is (report["accuracy"]["map"]["map50_95"] >= 1.0)
    assert report["table"].splitlines()[0].startswith(("TARGET", "BELOW TARGET", "COLLAPSED"))
    html = out.with_name("det.int8.report.html").read_text()
    assert "verdict" in html and "INT8 share of multiply-accumulates" in html
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_cli_leads_with_the_verdict_and_exits_3_when_the_target_is_missed(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 3, size=(64, 64))
    model = tiny_detector(tmp_path / "det.onnx", size=64)
    out = tmp_path / "o" / "det.int8.onnx"
    # 0.01 % of the MACs may go float: nothing fits, so a target of exactly FP32 is missed
    args = ("calibrate", str(model), "--images", str(folder), "--num", "3", "--max-drop", "0", "--max-float",
            "0.0001", "-o", str(out))
    r = run_cli(*args)
    report = json.loads(out.with_name("det.int8.report.json").read_text())
    if report["verdict"]["met"]:
        pytest.skip("INT8 matched FP32 exactly on these frames: nothing to refuse")
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines()[0].startswith("TARGET NOT MET")
    assert "INT8" in r.stdout.splitlines()[0] and "--no-strict" in r.stderr
    assert out.exists()  # the best model within the budget is still written, and it is the checked one
    assert report["sha256"]["onnx"]
    r2 = run_cli(*args, "--no-strict", "--force")
    assert r2.returncode == 0, r2.stderr
    r3 = run_cli(*args[:-2], "--max-float", "2", "-o", str(out))
    assert r3.returncode != 0 and "--max-float" in r3.stderr
