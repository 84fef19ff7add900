"""Speech tasks through the one Pipeline, as a user runs them: `edgert run --task wakeword` on a folder into a
real mosquitto (a persistent QoS 1 subscriber) and a JSONL file under a power budget, with the metrics endpoint
scraped while it runs and the report page loaded in headless Chromium; SIGTERM during a Whisper window; the
watchdog fed during a long window (a real notify socket).

The wake-word models are CC BY-NC-SA 4.0: used here for tests only.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ROOT
from tests.power import boards

from .conftest import silence

sf = pytest.importorskip("soundfile")
pytest.importorskip("onnxruntime")
SR = 16000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _edgert(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgert.cli.main", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def wake_folder(tmp_path_factory: pytest.TempPathFactory, espeak_clips: dict[str, Path],
                clip_0930: np.ndarray) -> Path:
    """Twelve clips: "hey jarvis", then a sentence (about a minute of audio in all)."""
    from edgert.speech import read_audio

    folder = tmp_path_factory.mktemp("wake")
    wake = read_audio(espeak_clips["hey_jarvis"])
    for i in range(12):
        sf.write(folder / f"ask{i:02d}.wav", np.concatenate([silence(0.5), wake, silence(0.6), clip_0930]), SR,
                 subtype="PCM_16")
    return folder


def test_wakeword_to_mqtt_and_jsonl_under_a_budget_with_metrics_and_report(
        tmp_path: Path, speech_models: Path, wake_folder: Path) -> None:
    from tests.io.chromium import Browser
    from tests.io.test_sink_mqtt import MOSQUITTO, TOPIC, Broker, Subscriber, _register_session
    from tests.report.conftest import find_chromium

    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    broker = Broker(tmp_path, _free_port())
    board = boards.orin_nano_jp6(tmp_path / "board")  # INA3221 in sysfs: 4.968 W on VDD_IN
    events, report, port = tmp_path / "ev.jsonl", tmp_path / "run.html", _free_port()
    try:
        _register_session(broker)  # the subscriber's persistent session exists; it is offline during the run
        proc = _edgert("run", "--task", "wakeword", "--model", str(speech_models / "openwakeword/hey_jarvis_v0.1.onnx"),
                       "--backend", "onnxruntime", "--source", str(wake_folder),
                       "--sink", f"mqtt://127.0.0.1:{broker.port}/{TOPIC}?events=only", "--sink", f"jsonl://{events}",
                       "--power-budget", "10", "--metrics", f"127.0.0.1:{port}", "--report", str(report), "--json",
                       env={"EDGERT_SYSROOT": str(board)})
        page = ""
        while proc.poll() is None and "edgert_speech_events_total" not in page:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    page = r.read().decode()
            except OSError:
                time.sleep(0.05)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        sub = Subscriber(broker.port).start()  # back online: the broker hands over what it kept for it
        try:
            summary = json.loads(out)
            lines = [json.loads(line) for line in events.read_text().splitlines()]
            wakes = [e for e in lines if e["type"] == "wake"]
            assert len(wakes) == summary["speech"]["wake_events"] >= 10, summary["speech"]
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(sub.messages) < len(wakes):
                time.sleep(0.05)
            assert sub.messages == wakes  # events=only: the wake words alone, every one, in order
        finally:
            sub.stop()
    finally:
        broker.stop()
    assert "edgert_speech_events_total" in page, page  # the run was scraped while it ran
    assert 'edgert_speech_rtf{stage="wakeword"}' in page and "edgert_speech_queue_depth" in page
    assert summary["power"]["budget_w"] == 10.0 and summary["watts"] is not None
    assert summary["stopped_by"] == "end of input" and summary["frames"] == summary["speech"]["chunks"]
    assert summary["speech"]["stages"]["wakeword"]["rtf"] > 0

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium not installed: the report was written but not rendered")
    with Browser(chromium) as browser:
        browser.load(report.as_uri())
        data = browser.evaluate("JSON.parse(document.getElementById('edgert-data').textContent)")
        assert data["summary"]["speech"]["wake_events"] == len(wakes)
        assert any(v is not None for v in data["series"]["rtf"])
        drawn = browser.evaluate("document.querySelectorAll('svg[data-chart=\"rtf\"] polyline').length")
        assert drawn >= 1 and browser.evaluate("document.querySelectorAll('svg[data-chart=\"watts\"]').length") == 1


@pytest.fixture(scope="module")
def long_speech(tmp_path_factory: pytest.TempPathFactory, librivox: Path) -> Path:
    """About 100 s of speech: four 30 s Whisper windows without a VAD."""
    from edgert.speech import read_audio

    clips = [read_audio(p) for p in sorted(librivox.glob("*.wav"))]
    audio = np.concatenate([np.concatenate([c, silence(0.3)]) for c in clips] * 5)
    path = tmp_path_factory.mktemp("long") / "long.wav"
    sf.write(path, audio, SR, subtype="PCM_16")
    return path


def test_sigterm_during_a_whisper_window_drains_and_says_what_was_cut(
        tmp_path: Path, speech_models: Path, long_speech: Path) -> None:
    events = tmp_path / "ev.jsonl"
    notify = _Notify(tmp_path)
    try:
        proc = _edgert("run", "--task", "asr", "--model", str(speech_models / "whisper-tiny.en"), "--backend",
                       "onnxruntime", "--source", str(long_speech), "--sink", f"jsonl://{events}", "--json",
                       # the drain under test, not the stop deadline (tests/faults/test_bounded_stop.py): a
                       # window on a loaded 2-core machine can take longer than the default 10 s
                       env={**notify.env, "EDGERT_STOP_DEADLINE_S": "120"})
        notify.wait_inside_window(proc, after=30 * SR // 512 + 1)  # the second 30 s window decodes now
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=240)
    finally:
        notify.close()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["stopped_by"] == "SIGTERM"
    text = events.read_text()
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]  # whole lines only
    assert lines and all(e["type"] == "transcript" for e in lines)
    speech = summary["speech"]
    assert speech["transcripts"] == len(lines) == 2  # the window in flight finished; the rest was not read
    total = sf.info(str(long_speech)).duration
    assert speech["audio_seconds"] < total - 1  # the source stopped early...
    assert speech["cut"]["untranscribed_s"] >= 0 and "cut" in speech  # ...and the summary says what it held


def test_watchdog_is_fed_during_a_long_whisper_window(tmp_path: Path, speech_models: Path, long_speech: Path) -> None:
    """A real notify socket and a 1 s watchdog: pings keep coming while one 30 s window decodes (the decoder's
    steps are the progress), not only when a chunk finishes."""
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.2)
    try:
        proc = _edgert("run", "--task", "asr", "--model", str(speech_models / "whisper-tiny.en"), "--backend",
                       "onnxruntime", "--source", str(long_speech), "--max-frames", str(30 * SR // 512 + 5),
                       "--json", env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "1000000",
                                      "WATCHDOG_PID": ""})
        messages: list[str] = []
        while proc.poll() is None:
            try:
                messages.append(sock.recv(4096).decode())
            except socket.timeout:
                pass
        out, err = proc.communicate(timeout=60)
    finally:
        sock.close()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    windows = summary["speech"]["stages"]["asr"]
    assert windows["calls"] == 1  # one full 30 s window; the chunks past it were cut by --max-frames
    assert summary["speech"]["cut"]["untranscribed_s"] > 0
    # Each ping carries STATUS with the frames done so far. A ping from a finished frame always shows a new
    # count; pings that repeat one count came while no frame finished: from the decoder's steps inside the window.
    counts = [int(re.search(r"(\d+) frames", m).group(1)) for m in messages  # type: ignore[union-attr]
              if "WATCHDOG=1" in m and re.search(r"\d+ frames", m)]
    repeats = max(collections.Counter(counts).values())
    assert repeats >= 3, counts
    assert windows["seconds"] > 0


def test_over_the_power_budget_whisper_windows_are_shed_and_counted(tmp_path: Path, speech_models: Path,
                                                                   clip_0930: np.ndarray) -> None:
    """The board draws 4.968 W (INA3221 in a fake sysfs) against a 2 W budget: chunks are not paced (audio cannot
    wait), and Whisper's windows are skipped instead, each counted with its seconds of audio."""
    from tests.helpers import run_cli

    folder = tmp_path / "clips"
    folder.mkdir()
    for i in range(3):
        sf.write(folder / f"c{i}.wav", np.concatenate([silence(1.5), clip_0930, silence(1.5)]), SR, subtype="PCM_16")
    config = tmp_path / "asr.yaml"
    vad = speech_models / "silero_vad.onnx"
    config.write_text(f"task: asr\nspeech:\n  chain: [vad, asr]\n  vad:\n    model: {vad}\n    min_silence_s: 0.5\n")
    board = boards.orin_nano_jp6(tmp_path / "board")
    r = run_cli("run", "--config", str(config), "--model", str(speech_models / "whisper-tiny.en"), "--backend",
                "onnxruntime", "--source", str(folder), "--power-budget", "2", "--json",
                env={"EDGERT_SYSROOT": str(board)}, timeout=300)
    assert r.returncode == 0, r.stderr
    speech = json.loads(r.stdout)["speech"]
    budget = speech["budget"]
    assert budget["over_budget_checks"] >= 1 and budget["windows_shed"] >= 1, speech
    assert speech["shed_segments"] == budget["windows_shed"] and budget["audio_shed_s"] > 0
    assert speech["transcripts"] + speech["shed_segments"] + speech["no_speech_segments"] == speech["segments"] == 3


def test_two_audio_sources_in_one_run_are_tagged_and_get_their_own_sinks(tmp_path: Path, speech_models: Path,
                                                                         clip_0930: np.ndarray) -> None:
    from tests.helpers import run_cli

    a, b = tmp_path / "a.wav", tmp_path / "b.wav"
    sf.write(a, np.concatenate([silence(1.0), clip_0930, silence(1.0)]), SR, subtype="PCM_16")
    sf.write(b, np.concatenate([silence(0.5), clip_0930, silence(0.5), clip_0930, silence(1.0)]), SR,
             subtype="PCM_16")
    shared = tmp_path / "all.jsonl"
    r = run_cli("run", "--task", "vad", "--model", str(speech_models / "silero_vad.onnx"), "--backend",
                "onnxruntime", "--source", str(a), "--source", str(b), "--sink", f"jsonl://{shared}",
                "--sink", f"jsonl://{tmp_path}/ev-{{source}}.jsonl", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    events = [json.loads(line) for line in shared.read_text().splitlines()]
    assert sorted({e["source"] for e in events}) == ["0", "1"]
    per = {name: [json.loads(x) for x in (tmp_path / f"ev-{name}.jsonl").read_text().splitlines()] for name in "01"}
    assert [e["stream"] for e in per["0"]] == [str(a)] and [e["stream"] for e in per["1"]] == [str(b)] * 2
    assert summary["speech"]["segments"] == 3 and len(summary["speech"]["per_source"]) == 2
    assert [s["frames"] for s in summary["sources"]] == [c["chunks"] for c in summary["speech"]["per_source"]]


class _Notify:
    """A real NOTIFY_SOCKET with a short watchdog: tells when the run is inside a Whisper window (two pings in a
    row with the same frame count: progress without a finished chunk) after ``after`` chunks."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "notify.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.2)
        self.env = {"NOTIFY_SOCKET": str(self.path), "WATCHDOG_USEC": "400000", "WATCHDOG_PID": ""}

    def wait_inside_window(self, proc: subprocess.Popen[str], after: int, timeout: float = 300) -> None:
        deadline, last = time.monotonic() + timeout, -1
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                m = re.search(r"(\d+) frames", self.sock.recv(4096).decode())
            except socket.timeout:
                continue
            if m:
                n = int(m.group(1))
                if n == last and n > after:
                    return
                last = n
        raise AssertionError(f"no Whisper window seen after {after} chunks: {proc.poll()}")

    def close(self) -> None:
        self.sock.close()


def test_a_second_sigterm_ends_the_whisper_window_at_its_next_decoder_step(
        tmp_path: Path, speech_models: Path, long_speech: Path) -> None:
    events = tmp_path / "ev.jsonl"
    notify = _Notify(tmp_path)
    try:
        proc = _edgert("run", "--task", "asr", "--model", str(speech_models / "whisper-tiny.en"), "--backend",
                       "onnxruntime", "--source", str(long_speech), "--sink", f"jsonl://{events}", "--json",
                       # the drain under test, not the stop deadline (tests/faults/test_bounded_stop.py): a
                       # window on a loaded 2-core machine can take longer than the default 10 s
                       env={**notify.env, "EDGERT_STOP_DEADLINE_S": "120"})
        notify.wait_inside_window(proc, after=30 * SR // 512 + 1)  # the second 30 s window decodes now
        written = events.read_text()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.8)  # a copy of the same signal within 0.5 s is not a second request
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=240)
    finally:
        notify.close()
    assert proc.returncode == 0, err
    assert "again: stopping now" in err
    summary = json.loads(out)
    # The window in flight was abandoned at a decoder step: no transcript of it, and the file holds whole lines.
    assert written.count("\n") == 1 and events.read_text() == written
    assert summary["speech"]["transcripts"] == 1 and summary["stopped_by"] == "SIGTERM"


def test_two_whisper_sources_share_one_model_and_transcribe_as_one_at_a_time(
        tmp_path: Path, speech_models: Path, librivox: Path) -> None:
    """Two audio files in one asr run: one Whisper in memory (the second source's is a fork of the first's), and
    each source's transcripts equal those of a run of that file alone."""
    from edgert.config import ModelConfig, PipelineConfig, SourceConfig
    from edgert.io.sinks import CallbackSink
    from edgert.pipeline import Pipeline
    from edgert.pipeline.speech import SpeechProcessor

    clips = [str(librivox / f"sense_and_sensibility_01_austen_64kb-{n}.wav") for n in ("0930", "0880")]
    model = ModelConfig(path=str(speech_models / "whisper-tiny.en"), backend="onnxruntime")

    def transcripts(*uris: str) -> dict[str, list[str]]:
        got: list[dict[str, object]] = []
        config = PipelineConfig(task="asr", model=model, sources=tuple(SourceConfig(uri=u) for u in uris))
        Pipeline(config, sinks=[CallbackSink(lambda r: got.extend(r.events), queue_size=4096)],
                 handle_signals=False, environment=False).run()
        out: dict[str, list[str]] = {}
        for e in got:
            if e["type"] == "transcript":
                out.setdefault(str(e["stream"]), []).append(str(e["text"]))
        return out

    together = transcripts(*clips)
    alone = {**transcripts(clips[0]), **transcripts(clips[1])}
    assert together == alone and sorted(together) == sorted(clips)
    processor = SpeechProcessor(PipelineConfig(task="asr", model=model), sources=2)
    try:
        first, second = (c.asr for c in processor.chains)
        assert first is not second and second._decoder._step is first._decoder._step
        assert second.encoder._sess is first.encoder._sess
    finally:
        processor.close()
