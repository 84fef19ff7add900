"""Speech fixtures: the real speech models and clips from the assets, shared per session (Whisper loads
once), and small real things built per test (WAV files, a fake ``arecord`` program)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgert.speech import Transcriber, read_audio

SR = 16000


@pytest.fixture(scope="session")
def speech_models(assets: Path) -> Path:
    path = assets / "models" / "speech"
    if not (path / "silero_vad.onnx").is_file():
        pytest.skip("speech models missing from the assets")
    return path


@pytest.fixture(scope="session")
def librivox(assets: Path) -> Path:
    return assets / "audio" / "librivox"


@pytest.fixture(scope="session")
def whisper(speech_models: Path) -> Iterator[Transcriber]:
    pytest.importorskip("tokenizers")
    with Transcriber(speech_models / "whisper-tiny.en", backend="onnxruntime") as asr:
        yield asr


@pytest.fixture(scope="session")
def clip_0930(librivox: Path) -> np.ndarray:
    """'he might even have been made amiable himself' (3.3 s)."""
    pytest.importorskip("soundfile")
    return read_audio(librivox / "sense_and_sensibility_01_austen_64kb-0930.wav")


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), dtype=np.float32)


def speech_edges(audio: np.ndarray, drop_db: float = 30.0) -> tuple[float, float]:
    """Reference speech edges: first and last 10 ms frame within ``drop_db`` of the loudest frame.

    30 dB sits between these clips' noise floor (35-40 dB down) and soft speech: at 25 dB the fading
    final "them" of clip 0870 falls outside (0.27 s early), at 35-40 dB the clip's own noise counts.
    """
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160)
    db = 10 * np.log10(np.mean(frames.astype(np.float64) ** 2, axis=1) + 1e-12)
    loud = np.flatnonzero(db >= db.max() - drop_db)
    return loud[0] * 0.01, (loud[-1] + 1) * 0.01


@pytest.fixture(scope="session")
def espeak_clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """'hey jarvis' and 'alexa' spoken by espeak-ng (22.05 kHz WAVs, so they are resampled on read)."""
    exe = shutil.which("espeak-ng") or shutil.which("espeak")
    if exe is None:
        pytest.skip("espeak-ng not installed (apt install espeak-ng): no spoken wake word to test with")
    folder = tmp_path_factory.mktemp("espeak")
    out = {}
    for name, text in (("hey_jarvis", "hey jarvis"), ("alexa", "alexa")):
        path = folder / f"{name}.wav"
        subprocess.run([exe, "-v", "en", "-s", "140", "-w", str(path), text], check=True, capture_output=True)
        out[name] = path
    return out


FAKE_ARECORD = """#!{python}
# Stands in for alsa-utils' arecord: writes raw S16_LE PCM of a WAV to stdout as arecord does.
import sys, time, numpy as np, soundfile as sf
mode = {mode!r}
if mode == "fail":
    sys.stderr.write("arecord: main:850: audio open error: No such file or directory\\n")
    sys.exit(1)
audio, _ = sf.read({wav!r}, dtype="int16")
sys.stdout.buffer.write(audio.astype("<i2").tobytes())
sys.stdout.buffer.flush()
time.sleep(30)  # a microphone does not end; the test stops reading
"""


def fake_arecord(folder: Path, wav: Path | None, mode: str = "ok") -> Path:
    """A folder holding an executable ``arecord`` (put it first on PATH)."""
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "arecord"
    exe.write_text(FAKE_ARECORD.format(python=sys.executable, mode=mode, wav=str(wav or "")))
    exe.chmod(0o755)
    return folder
