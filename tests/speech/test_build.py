"""The speech models through ``edgert build`` with TensorRT-RTX, which builds engines on a CPU-only
machine (no engine runs here: that needs an RTX GPU). The If-node Silero export cannot build and must
say so in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgert._lazy import is_importable

from ..helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.skipif(not is_importable("tensorrt_rtx"), reason="tensorrt-rtx not installed")


@pytest.mark.parametrize(("model", "shapes"), [
    ("whisper-tiny.en/encoder.onnx", []),
    ("silero_vad_op18_ifless.onnx", ["input:1x576/1x576/1x576", "state:2x1x128/2x1x128/2x1x128"]),
    ("openwakeword/melspectrogram.onnx", ["input:1x1760/1x1760/1x1760"]),
    ("openwakeword/embedding_model.onnx", ["input_1:1x76x32x1/1x76x32x1/1x76x32x1"]),
])
def test_speech_models_build(tmp_path: Path, speech_models: Path, model: str, shapes: list[str]) -> None:
    out = tmp_path / "m.engine"
    args = [f"--shapes={s}" for s in shapes]
    r = run_cli("build", str(speech_models / model), "-o", str(out), "--backend", "tensorrt-rtx", "--no-progress",
                *args)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 100_000


def test_silero_with_if_nodes_fails_in_one_line(tmp_path: Path, speech_models: Path) -> None:
    r = run_cli("build", str(speech_models / "silero_vad.onnx"), "-o", str(tmp_path / "v.engine"),
                "--backend", "tensorrt-rtx", "--no-progress",
                "--shapes=input:1x576/1x576/1x576", "--shapes=state:2x1x128/2x1x128/2x1x128")
    assert_one_line_error(r, "could not build", "another backend")
