"""edgert on a real TensorRT (8.5 on the device machine: scripts/gpu_trt85.sh tests): builds at each precision,
the engine cache and its sidecar, a foreign engine refused, the layer report, part batches through an
optimization profile per context, and detections that agree with ONNX Runtime's. NanoDet goes through the
constant-folding retry (TensorRT 8.5's parser refuses its shape computation). Skips where TensorRT or a GPU is
missing.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.gpu.test_gpu_device import NANODET, _frames, _model
from tests.helpers import assert_one_line_error, run_cli


def _trt_reason() -> str | None:
    from edgert.backends import backend_class

    probe = backend_class("tensorrt")().probe()
    return None if probe.available else probe.reason


_REASON = _trt_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.fixture(scope="module")
def nanodet(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of NanoDet (engines are written beside it) with its FP32 engine built."""
    from edgert.builder.engine_builder import BuildOptions, build_engine

    model = tmp_path_factory.mktemp("trt") / "nanodet.onnx"
    shutil.copy(_model(assets, NANODET), model)
    build_engine(model, None, BuildOptions(backend="tensorrt", detailed_layers=True))
    return model


def test_fp32_engine_detects_what_onnxruntime_detects(assets: Path, nanodet: Path) -> None:
    """FP32 within TensorRT's float noise (TF32 on Ampere and newer): the same boxes as ONNX Runtime's CPU run."""
    from edgert.calib.comparison import compare_detectors

    frames = [(f"f{k}", f) for k, f in enumerate(_frames(assets, 4))]
    r = compare_detectors(nanodet, nanodet, frames, backend="onnxruntime", candidate_backend="tensorrt")
    print(f"TensorRT FP32 vs ONNX Runtime: mAP@0.5:0.95 {r['map']['map50_95']}, outputs {r['outputs']}")
    assert r["map"]["ground_truth"] > 10
    assert r["map_strict"]["map50_95"] >= 0.97
    assert all(o["relative_l2"] < 1e-2 for o in r["outputs"])


def test_fp16_engine_agrees_with_fp32(assets: Path, nanodet: Path, tmp_path: Path) -> None:
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.calib.comparison import compare_detectors

    fp16 = tmp_path / "nanodet16.onnx"
    shutil.copy(nanodet, fp16)
    res = build_engine(fp16, None, BuildOptions(backend="tensorrt", precision="fp16"))
    assert res.status == "built" and res.record.precision == "fp16"
    frames = [(f"f{k}", f) for k, f in enumerate(_frames(assets, 4))]
    r = compare_detectors(nanodet, fp16, frames, backend="tensorrt")
    print(f"FP16 vs FP32 engine: mAP@0.5:0.95 {r['map']['map50_95']}")
    assert r["map"]["map50_95"] >= 0.9


def test_cache_reuses_then_rebuilds_on_a_changed_model(nanodet: Path, tmp_path: Path) -> None:
    import onnx

    from edgert.builder.engine_builder import BuildOptions, build_engine

    model = tmp_path / "m.onnx"
    shutil.copy(nanodet, model)
    first = build_engine(model, None, BuildOptions(backend="tensorrt"))
    again = build_engine(model, None, BuildOptions(backend="tensorrt"))
    assert (first.status, again.status) == ("built", "reused")
    assert first.record.trt_version.startswith(("8.", "9.", "10.", "11."))
    assert first.record.builder_flags.get("library_tactics") is (not first.record.trt_version.startswith(("8.", "9.")))
    proto = onnx.load(str(model))
    proto.doc_string = "retrained"
    onnx.save(proto, str(model))
    changed = build_engine(model, None, BuildOptions(backend="tensorrt"))
    assert changed.status == "rebuilt" and "onnx" in changed.reason.lower()


def test_a_foreign_engine_is_refused_in_one_line(nanodet: Path, tmp_path: Path) -> None:
    engine = tmp_path / "foreign.engine"
    shutil.copy(nanodet.with_suffix(".engine"), engine)
    record = json.loads(nanodet.with_suffix(".engine.json").read_text())
    record["trt_version"] = "7.1.3"
    engine.with_name(engine.name + ".json").write_text(json.dumps(record))
    result = run_cli("bench", str(engine), "--backend", "tensorrt", "--iterations", "5")
    assert_one_line_error(result, "7.1.3", "edgert build")


def test_layer_report_of_a_detailed_engine(nanodet: Path) -> None:
    from edgert.backends import open_session
    from edgert.engine.layers import summarize_layers

    with open_session(nanodet.with_suffix(".engine"), "tensorrt") as session:
        summary = summarize_layers(session.layer_information())
    print(f"layer report: {summary.to_json()}")
    assert summary.detailed and summary.layers > 20
    assert summary.by_precision.get("fp32", 0) > 10 and summary.by_precision.get("int8", 0) == 0


def test_part_batches_run_through_the_optimization_profile(assets: Path, nanodet: Path, tmp_path: Path) -> None:
    """An engine built with --batch 4 (profile 1..4): the GPU processor runs 1, 2 and 4 on one context per slot,
    and a part batch gives each frame the detections the full batch gives it."""
    from edgert.config import ModelConfig, PipelineConfig, RuntimeConfig
    from edgert.pipeline.choice import open_processor
    from edgert.pipeline.gpu import GpuProcessor, GpuSlot
    from edgert.stats import STAGES

    result = run_cli("build", str(nanodet), "--backend", "tensorrt", "--batch", "4", timeout=900)
    assert result.returncode == 0, result.stderr
    config = PipelineConfig(model=ModelConfig(path=str(nanodet), backend="tensorrt"),
                            runtime=RuntimeConfig(processing="gpu", slots=1, batch=4))
    frames = _frames(assets, 2)
    with open_processor(config, batch=4) as proc:
        assert isinstance(proc, GpuProcessor) and list(proc.batch_sizes) == [1, 2, 4], proc.batch_sizes_rule
        slot = proc.slots[0]
        assert isinstance(slot, GpuSlot)
        with slot.device.active():
            full = slot.process(frames, [np.zeros(len(STAGES)) for _ in frames])
            parts = [d for a, b in ((0, 1), (1, 4)) for d in
                     slot.process(frames[a:b], [np.zeros(len(STAGES)) for _ in frames[a:b]])]
    assert sum(len(d) for d in full) > 0
    for g, w in zip(parts, full):
        assert np.array_equal(g.class_id, w.class_id)
        assert np.allclose(g.xyxy, w.xyxy, atol=0.5)


def test_a_batched_run_without_its_engine_names_the_build_command(nanodet: Path, assets: Path) -> None:
    video = str(assets / "video" / "vtest.avi")
    model = nanodet.with_name("unbuilt.onnx")
    shutil.copy(nanodet, model)
    result = run_cli("run", "--backend", "tensorrt", "--model", str(model), "--source", video, "--source", video,
                     "--max-frames", "4")
    assert_one_line_error(result, f"edgert build {model} --backend tensorrt --batch 2")


def test_a_second_context_of_a_one_profile_engine_is_refused_and_the_processor_runs_fewer_slots(
        assets: Path, nanodet: Path, tmp_path: Path) -> None:
    from edgert.backends import SessionOptions, open_session
    from edgert.builder import parse_shapes
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.cli.build import batch_profiles
    from edgert.errors import NoMoreContexts

    model = tmp_path / "one.onnx"
    shutil.copy(nanodet, model)
    target, shapes = batch_profiles(model, 2)
    res = build_engine(target, None, BuildOptions(backend="tensorrt", profiles=tuple(parse_shapes(shapes))))
    import tensorrt

    with open_session(res.engine, "tensorrt", SessionOptions(shapes={"images": (1, 3, 416, 416)})) as first:
        if int(tensorrt.__version__.split(".")[0]) < 10:  # 8.x: a profile per context (seen on 8.5.3)
            with pytest.raises(NoMoreContexts, match="edgert build --contexts"):
                first.fork()
        else:
            first.fork().close()


def test_edgert_run_on_tensorrt(assets: Path, nanodet: Path) -> None:
    result = run_cli("run", "--backend", "tensorrt", "--model", str(nanodet), "--source",
                     str(assets / "video" / "vtest.avi"), "--max-frames", "40", "--json", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["processing"] == "gpu" and summary["frames"] == 40


def test_builds_side_by_side_keep_each_others_timings(tmp_path: Path) -> None:
    """A build that loaded the timing cache before another build saved (two `edgert build` at once, a background
    model update) merges its timings into the file instead of writing over the other build's."""
    import tensorrt as trt

    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.builder.timing_cache import TimingCache
    from tests.helpers import tiny_model

    cache_dir = tmp_path / "cache"
    options = BuildOptions(backend="tensorrt", cache_dir=cache_dir)
    build_engine(tiny_model(tmp_path / "a.onnx", (1, 3, 64, 64), "Relu"), None, options)
    (path,) = (cache_dir / "timing").glob("*.cache")
    path.unlink()
    config = trt.Builder(trt.Logger(trt.Logger.ERROR)).create_builder_config()
    early = TimingCache(path)
    early.attach(config)  # empty: the other build has not saved yet
    build_engine(tiny_model(tmp_path / "b.onnx", (1, 8, 32, 32), "Sigmoid"), None, options)
    other = path.read_bytes()
    empty = bytes(memoryview(config.get_timing_cache().serialize()))
    assert len(other) > len(empty)
    early.save(config)
    assert len(path.read_bytes()) >= len(other)  # the other build's timings are still there


def test_builds_one_after_another_keep_the_timing_cache_without_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The second build loads the first one's timings and saves them with its own: nothing to merge, so no
    "could not be merged" warning (each build after the first gave one on TensorRT 8.5)."""
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from tests.helpers import tiny_model

    cache_dir = tmp_path / "cache"
    options = BuildOptions(backend="tensorrt", cache_dir=cache_dir)
    build_engine(tiny_model(tmp_path / "a.onnx", (1, 3, 64, 64), "Relu"), None, options)
    (path,) = (cache_dir / "timing").glob("*.cache")
    first = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="edgert.builder.timing_cache"):
        build_engine(tiny_model(tmp_path / "b.onnx", (1, 8, 32, 32), "Sigmoid"), None, options)
    assert not [r for r in caplog.records if r.name == "edgert.builder.timing_cache"], caplog.text
    assert len(path.read_bytes()) > len(first)  # the second build's timings joined the first's


def test_int8_engine_runs_its_float_layers_in_fp16(assets: Path, nanodet: Path, tmp_path: Path) -> None:
    """A Q/DQ model from edgert calibrate builds with FP16 allowed beside INT8 (trtexec's --best): the layers it
    keeps float run in FP16, not FP32."""
    from edgert.builder.engine_builder import BuildOptions, build_engine
    from edgert.engine.layers import summarize_layers

    qdq = tmp_path / "nanodet-int8.onnx"
    res = run_cli("calibrate", str(nanodet), "--images", str(assets / "images"), "--num", "8", "--no-check",
                  "-o", str(qdq), timeout=600)
    assert res.returncode == 0, res.stderr
    built = build_engine(qdq, None, BuildOptions(backend="tensorrt", precision="int8", detailed_layers=True))
    assert built.record.builder_flags["fp16_flag"] is True and built.record.builder_flags["explicit_quantization"]
    from edgert.backends import open_session

    with open_session(qdq.with_suffix(".engine"), "tensorrt") as session:
        summary = summarize_layers(session.layer_information())
    print(f"INT8 engine layers: {summary.by_precision}, reformats {summary.reformats}")
    assert summary.by_precision.get("int8", 0) > 10 and summary.by_precision.get("fp16", 0) > 0
    from edgert.calib.comparison import compare_detectors

    frames = [(f"f{k}", f) for k, f in enumerate(_frames(assets, 4))]
    r = compare_detectors(nanodet, qdq, frames, backend="tensorrt")
    print(f"INT8 vs FP32 engine: mAP@0.5:0.95 {r['map']['map50_95']}")
    assert r["map"]["map50_95"] >= 0.75  # a collapse, not the accuracy figure (8 calibration images here)
