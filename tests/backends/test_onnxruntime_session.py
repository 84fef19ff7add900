from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from edgert.backends import SessionOptions, choose_backend, get_backend, open_session
from edgert.errors import BackendUnavailable, ConfigError, InputError, ModelError
from tests.helpers import assert_one_line_error, run_cli, scale_model, tiny_model

pytest.importorskip("onnxruntime")


def test_yolov3_tiny_reports_specs_and_runs(assets: Path) -> None:
    model = assets / "models/detection/yolov3-tiny-coco-416.onnx"
    with open_session(model, "onnxruntime") as session:
        (inp,) = session.input_specs
        (out,) = session.output_specs
        assert (inp.name, inp.shape, inp.dtype) == ("images", (1, 3, 416, 416), np.float32)
        assert (out.name, out.shape) == ("output0", (1, 2535, 85))
        session.inputs["images"][:] = 0.5
        outputs = session.infer()
        assert outputs["output0"].shape == (1, 2535, 85)
        assert np.isfinite(outputs["output0"]).all()
        assert outputs["output0"][..., 4].max() <= 1.0  # objectness is a probability


def test_steady_state_infer_reuses_the_same_output_buffer(assets: Path) -> None:
    model = assets / "models/detection/yolov3-tiny-coco-416.onnx"
    with open_session(model, "onnxruntime") as session:
        first = session.infer()["output0"]
        buffers = {id(session.infer()["output0"]) for _ in range(5)}
        assert buffers == {id(first)}
        assert session.outputs["output0"] is first


def test_infer_writes_into_preallocated_buffers_without_allocating(tmp_path: Path) -> None:
    model = scale_model(tmp_path / "scale.onnx", shape=(1, 256), factor=3.0)
    with open_session(model, "onnxruntime") as session:
        out = session.outputs["y"]
        session.inputs["x"][:] = np.arange(256, dtype=np.float32)
        for _ in range(3):
            session.infer()  # warm up
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(200):
            session.infer()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
        assert growth < 4096, f"{growth} bytes allocated over 200 calls"
        np.testing.assert_allclose(out, 3.0 * np.arange(256, dtype=np.float32)[None])


def test_feed_is_validated_once_in_the_base_class(tmp_path: Path) -> None:
    model = scale_model(tmp_path / "scale.onnx")
    with open_session(model, "onnxruntime") as session:
        out = session.infer({"x": np.ones((1, 4), np.float32)})
        np.testing.assert_allclose(out["y"], 2.0)
        with pytest.raises(InputError, match="Received dtype float64"):
            session.infer({"x": np.ones((1, 4))})
        with pytest.raises(InputError, match=r"Received shape \(1, 5\)"):
            session.infer({"x": np.ones((1, 5), np.float32)})
        with pytest.raises(InputError, match="not an input of this model"):
            session.infer({"z": np.ones((1, 4), np.float32)})


def test_dynamic_input_takes_its_shape_at_open(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "dyn.onnx", shape=("batch", 3, "h", "w"))
    opts = SessionOptions(shapes={"x": (2, 3, 5, 7)})
    with open_session(model, "onnxruntime", opts) as session:
        assert session.input_specs[0].shape == ("batch", 3, "h", "w")
        assert session.inputs["x"].shape == (2, 3, 5, 7)
        session.inputs["x"][:] = -1.0
        assert session.infer()["y"].shape == (2, 3, 5, 7)
        assert session.outputs["y"].max() == 0.0  # Relu of -1


def test_closed_session_refuses_to_run(tmp_path: Path) -> None:
    session = open_session(scale_model(tmp_path / "s.onnx"), "onnxruntime")
    session.close()
    with pytest.raises(InputError, match="closed"):
        session.infer()


def test_missing_and_broken_models_are_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model file not found"):
        open_session(tmp_path / "nope.onnx", "onnxruntime")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07garbage")
    with pytest.raises(ModelError, match="cannot load this model"):
        open_session(broken, "onnxruntime")


def test_unknown_backend_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"valid backends are auto, .*onnxruntime"):
        get_backend("tensorflow")


def test_auto_picks_a_backend_that_can_run_here() -> None:
    name, probes = choose_backend()
    chosen = next(p for p in probes if p.name == name)
    assert chosen.available
    # Everything ahead of the chosen one in the auto order was probed and refused, with a reason.
    for probe in probes[: probes.index(chosen)]:
        assert not probe.available and probe.reason


def test_unavailable_backend_says_why() -> None:
    _, probes = choose_backend()
    refused = [p for p in probes if not p.available]
    if not refused:
        pytest.skip("every backend is available on this machine")
    with pytest.raises(BackendUnavailable) as err:
        get_backend(refused[0].name)
    assert refused[0].reason in str(err.value)


def test_missing_model_through_cli_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("inspect", str(tmp_path / "missing.onnx")), "missing.onnx: model file not found")


def test_inspect_through_cli(assets: Path) -> None:
    result = run_cli("inspect", str(assets / "models/detection/yolov8s-fall-640.onnx"), "--json")
    assert result.returncode == 0, result.stderr
    assert "images float32[1,3,640,640]" in result.stdout
    assert "Normal" in result.stdout  # Ultralytics metadata comes through


def test_a_model_that_cannot_run_on_zeros_still_opens(assets: Path) -> None:
    """Silero VAD's If nodes reject sr=0, so its outputs cannot be sized by a probe run at open."""
    model = assets / "models/speech/silero_vad.onnx"
    with open_session(model, "onnxruntime", SessionOptions(shapes={"input": (1, 576)})) as session:
        out = session.infer({"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32),
                             "sr": np.array(16000, np.int64)})
        assert out["output"].shape == (1, 1)
        assert 0.0 <= float(out["output"][0, 0]) <= 1.0
