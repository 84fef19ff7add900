"""Real engine builds with TensorRT-RTX, which parses and builds on this CPU-only machine.

Everything goes through the real CLI in a subprocess, as a user runs it. Skips when tensorrt_rtx is not
installed (pip install 'edgert[rtx]').
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgert._lazy import is_importable
from edgert.engine.file import read_engine_file
from tests.builder.test_engine_files import ultralytics_engine
from tests.helpers import assert_one_line_error, run_cli, tiny_model

pytestmark = pytest.mark.skipif(not is_importable("tensorrt_rtx"),
                                reason="tensorrt_rtx not installed: pip install 'edgert[rtx]'")

DETECTORS = ("yolov8s-fall-640.onnx", "nanodet-m-416-coco-v8layout.onnx", "yolov3-tiny-coco-416.onnx")


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {"EDGERT_CACHE_DIR": str(tmp_path / "cache")}


def build(*args: str, env: dict[str, str]) -> tuple[str, str]:
    res = run_cli("build", *args, "--backend", "tensorrt-rtx", env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return res.stdout, res.stderr


@pytest.mark.parametrize("name", DETECTORS)
def test_detector_builds_writes_sidecar_then_reuses(assets: Path, tmp_path: Path, env: dict[str, str],
                                                    name: str) -> None:
    model = assets / "models" / "detection" / name
    engine = tmp_path / (Path(name).stem + ".engine")
    out, _ = build(str(model), "-o", str(engine), env=env)
    assert out.startswith(f"built {engine} [tensorrt-rtx ")
    side = json.loads((tmp_path / (engine.name + ".json")).read_text())
    assert side["onnx_sha256"] == __import__("hashlib").sha256(model.read_bytes()).hexdigest()
    assert side["backend"] == "tensorrt-rtx" and side["precision"] == "fp32"
    assert side["gpu"]["name"] == "none (CPU build)" and side["gpu"]["compute_capability"] is None
    assert side["builder_flags"]["strongly_typed"] is True
    assert side["trt_version"].count(".") >= 2 and side["build_seconds"] > 0
    assert side["engine_bytes"] == engine.stat().st_size > 1_000_000
    assert side["calibration_cache_sha256"] is None and side["profiles"] == []
    assert side["inputs"][0]["name"] == "images"
    assert list((tmp_path / "cache" / "timing").glob("tensorrt-rtx-*.cache"))  # persistent timing cache

    mtime = engine.stat().st_mtime_ns
    out, _ = build(str(model), "-o", str(engine), env=env)
    assert out.startswith(f"reused cached engine {engine}")
    assert engine.stat().st_mtime_ns == mtime
    assert json.loads((tmp_path / (engine.name + ".json")).read_text())["built_at"] == side["built_at"]


def test_engine_from_another_tensorrt_or_gpu_is_rebuilt(assets: Path, tmp_path: Path, env: dict[str, str]) -> None:
    model = assets / "models" / "detection" / "nanodet-m-416-coco-v8layout.onnx"
    engine = tmp_path / "nd.engine"
    build(str(model), "-o", str(engine), env=env)
    sidecar = tmp_path / "nd.engine.json"
    for field, value, needle in (("trt_version", "1.0.0.1", "built with tensorrt-rtx 1.0.0.1, this machine has"),
                                 ("gpu", {"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9"},
                                  "built for GPU NVIDIA GeForce RTX 4090 (compute 8.9), this machine has none")):
        data = json.loads(sidecar.read_text())
        data[field] = value
        sidecar.write_text(json.dumps(data))
        out, err = build(str(model), "-o", str(engine), env=env)
        assert out.startswith(f"rebuilt {engine}") and needle in out, out
        assert needle in err  # the warning says why before the build starts


def test_foreign_engine_fails_to_load_with_a_clear_error(assets: Path, tmp_path: Path, env: dict[str, str]) -> None:
    from edgert.backends.tensorrt import TensorRTRTXBackend
    from edgert.errors import EngineCacheError

    model = assets / "models" / "detection" / "yolov3-tiny-coco-416.onnx"
    engine = tmp_path / "y3.engine"
    build(str(model), "-o", str(engine), env=env)
    sidecar = tmp_path / "y3.engine.json"
    data = json.loads(sidecar.read_text())
    data["trt_version"] = "0.9.0"
    sidecar.write_text(json.dumps(data))
    with pytest.raises(EngineCacheError, match=r"built with tensorrt-rtx 0\.9\.0, this machine has .*; rebuild it: "
                                               r"edgert build .*yolov3-tiny-coco-416\.onnx --backend tensorrt-rtx"):
        TensorRTRTXBackend().open(engine)
    # Given the ONNX model, the runtime looks for the engine edgert build made; it never builds one itself.
    with pytest.raises(EngineCacheError, match="no engine built yet"):
        TensorRTRTXBackend().open(tiny_model(tmp_path / "fresh.onnx"))


def test_ultralytics_engine_file_round_trip(assets: Path, tmp_path: Path, env: dict[str, str]) -> None:
    model = assets / "models" / "detection" / "yolov8s-fall-640.onnx"
    engine = tmp_path / "plain.engine"
    build(str(model), "-o", str(engine), env=env)
    meta = {"names": {"0": "Normal", "1": "Fall"}, "imgsz": [640, 640], "stride": 32}
    ul = ultralytics_engine(tmp_path / "ultra.engine", meta, engine.read_bytes())
    ef = read_engine_file(ul)
    assert ef.metadata == meta and ef.plan == engine.read_bytes()


def broken_models(tmp_path: Path) -> dict[str, Path]:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 4], np.ones(4, np.float32).tolist())
    shapes = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"], name="bad_add"),
                                helper.make_node("Relu", ["t"], ["y"], name="relu")], "g", [x], [y], [w])
    unknown = helper.make_graph([helper.make_node("FrobnicateLinear", ["x"], ["y"], name="frob")], "g", [x], [y])
    out = {}
    for name, graph in (("shapes", shapes), ("unknown", unknown)):
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        out[name] = tmp_path / f"{name}.onnx"
        onnx.save(m, str(out[name]))
    return out


def test_broken_onnx_gets_the_parsers_node_error_in_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    models = broken_models(tmp_path)
    res = run_cli("build", str(models["shapes"]), "--backend", "tensorrt-rtx", "-o", str(tmp_path / "a.engine"),
                  env=env)
    assert_one_line_error(res, "TensorRT's ONNX parser failed at node 'bad_add' (Add):", "broadcast dimensions")
    res = run_cli("build", str(models["unknown"]), "--backend", "tensorrt-rtx", env=env)
    assert_one_line_error(res, "node 'frob' (FrobnicateLinear)", "Plugin not found")
    assert not (tmp_path / "unknown.engine").exists()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(models["shapes"].read_bytes()[:37])
    assert_one_line_error(run_cli("build", str(truncated), "--backend", "tensorrt-rtx", env=env), "truncated.onnx")


def test_stage_that_cannot_build_suggests_another_backend(assets: Path, tmp_path: Path, env: dict[str, str]) -> None:
    vad = assets / "models" / "speech" / "silero_vad.onnx"
    res = run_cli("build", str(vad), "--backend", "tensorrt-rtx", "-o", str(tmp_path / "v.engine"), env=env)
    assert_one_line_error(res, "input input has dynamic shape", "--shapes input:")
    res = run_cli("build", str(vad), "--backend", "tensorrt-rtx", "-o", str(tmp_path / "v.engine"),
                  "--shapes", "input:1x576,state:2x1x128", env=env, timeout=300)
    assert_one_line_error(res, "silero_vad.onnx: tensorrt-rtx could not build an engine:",
                          "run this model on another backend (--backend onnxruntime")


def test_dynamic_model_builds_with_a_profile(assets: Path, tmp_path: Path, env: dict[str, str]) -> None:
    vad = assets / "models" / "speech" / "silero_vad_op18_ifless.onnx"
    engine = tmp_path / "vad.engine"
    out, _ = build(str(vad), "-o", str(engine), "--shapes", "input:1x576/1x576/4x576",
                   "--shapes", "state:2x1x128/2x1x128/2x4x128", env=env)
    assert out.startswith("built")
    side = json.loads((tmp_path / "vad.engine.json").read_text())
    assert side["profiles"] == [{"name": "input", "min": [1, 576], "opt": [1, 576], "max": [4, 576]},
                                {"name": "state", "min": [2, 1, 128], "opt": [2, 1, 128], "max": [2, 4, 128]}]
    # Another profile is another engine.
    out, err = build(str(vad), "-o", str(engine), "--shapes", "input:1x576/2x576/8x576",
                     "--shapes", "state:2x1x128/2x2x128/2x8x128", env=env)
    assert out.startswith("rebuilt") and "optimization profiles" in err


def test_precision_requests_a_strongly_typed_builder_cannot_honour(tmp_path: Path, env: dict[str, str]) -> None:
    from tests.builder.test_onnx_info import qdq_model

    model = tiny_model(tmp_path / "t.onnx")
    qdq = qdq_model(tmp_path / "q.onnx")
    assert_one_line_error(run_cli("build", str(qdq), "--backend", "tensorrt-rtx", "--precision", "fp16", env=env),
                          "Q/DQ model cannot be built at FP16")
    assert_one_line_error(run_cli("build", str(model), "--backend", "tensorrt-rtx", "--precision", "int8", env=env),
                          "quantize the model to Q/DQ")
    assert not (tmp_path / "t.engine").exists()


def test_progress_indicator_and_json(tmp_path: Path, env: dict[str, str]) -> None:
    model = tiny_model(tmp_path / "t.onnx")
    res = run_cli("build", str(model), "--backend", "tensorrt-rtx", "--progress", "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert "building t.onnx" in res.stderr
    data = json.loads(res.stdout)
    assert data["status"] == "built" and data["record"]["edgert_sidecar"] == 1
    assert os.path.exists(data["engine"]) and os.path.exists(data["sidecar"])


def test_explicit_qdq_model_builds_as_int8(tmp_path: Path, env: dict[str, str]) -> None:
    from tests.builder.test_onnx_info import qdq_model

    model = qdq_model(tmp_path / "q.onnx")
    out, _ = build(str(model), "--precision", "int8", env=env)
    assert out.startswith("built") and ", int8," in out
    side = json.loads((tmp_path / "q.engine.json").read_text())
    assert side["builder_flags"]["explicit_quantization"] is True and side["precision"] == "int8"
    assert side["builder_flags"]["fp16_flag"] is False  # strongly typed: float layers in the ONNX's own types


@pytest.mark.skipif(not is_importable("onnxconverter_common"), reason="pip install 'edgert[fp16]'")
@pytest.mark.parametrize("name", DETECTORS[:2])
def test_fp16_on_a_strongly_typed_builder_converts_the_onnx(assets: Path, tmp_path: Path, env: dict[str, str],
                                                              name: str) -> None:
    model = assets / "models" / "detection" / name
    fp32, fp16 = tmp_path / "fp32.engine", tmp_path / "fp16.engine"
    build(str(model), "-o", str(fp32), env=env)
    out, _ = build(str(model), "-o", str(fp16), "--precision", "fp16", env=env)
    assert out.startswith("built") and ", fp16," in out
    side = json.loads((tmp_path / "fp16.engine.json").read_text())
    assert side["precision"] == "fp16" and side["builder_flags"]["fp16_route"] == "onnx-fp16"
    assert side["builder_flags"]["fp16_converter"].startswith("onnxconverter-common ")
    assert side["onnx_sha256"] == json.loads((tmp_path / "fp32.engine.json").read_text())["onnx_sha256"]
    converted = Path(side["built_from"])
    assert converted.parent == tmp_path / "cache" / "fp16" and converted.is_file()
    assert any(i.data_type == TensorProto.FLOAT16 for i in onnx.load(str(converted)).graph.initializer)
    assert fp16.stat().st_size < 0.7 * fp32.stat().st_size
    assert json.loads((tmp_path / "fp32.engine.json").read_text())["builder_flags"]["fp16_route"] is None
    out, _ = build(str(model), "-o", str(fp16), "--precision", "fp16", env=env)
    assert out.startswith("reused")
