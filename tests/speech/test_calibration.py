"""Calibration data from a folder of clips, fed to the calibration collector on the real Whisper encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgert.errors import CalibrationError
from edgert.speech.calibration import CalibrationClips, whisper_encoder_fill


def test_clips_are_drawn_deterministically_and_bad_ones_skipped(tmp_path: Path, assets: Path) -> None:
    sf = pytest.importorskip("soundfile")
    for i in range(4):
        sf.write(tmp_path / f"{i}.wav", np.zeros(1600, dtype=np.float32), 16000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
    first = [p.name for p, _ in CalibrationClips(tmp_path, num=5, seed=1)]
    again = CalibrationClips(tmp_path, num=5, seed=1)
    assert [p.name for p, _ in again] == first and len(first) == 4
    assert list(again.skipped) == [str(tmp_path / "sub" / "broken.wav")]
    with pytest.raises(CalibrationError, match="no audio clips"):
        CalibrationClips(assets / "images")


def test_whisper_encoder_activations_from_real_clips(speech_models: Path, librivox: Path) -> None:
    import onnx

    from edgert.calib.collect import ActivationCollector

    model = onnx.load(str(speech_models / "whisper-tiny.en" / "encoder.onnx"))
    tensors = ["mel", *[n.output[0] for n in model.graph.node if n.op_type == "MatMul"][:2]]
    clips = CalibrationClips(librivox, num=2)
    collector = ActivationCollector(model, tensors)
    buffer = np.zeros((1, 80, 3000), dtype=np.float32)
    histograms = collector.run(clips, whisper_encoder_fill, buffer, progress=False)
    collector.close()
    assert collector.samples == 2 and len(clips.used) == 2
    assert set(histograms) == set(tensors)
    # Whisper's log-mel of one clip spans at most 2 after the max - 8 clamp and (x + 4) / 4; two clips
    # with different loudness a little more.
    mel = histograms["mel"]
    assert mel.count == 2 * 80 * 3000 and 1.0 < mel.max - mel.min < 2.5
