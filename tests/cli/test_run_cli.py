"""``edgert run`` and ``edgert demo`` through the real CLI in subprocesses: output, bad input, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ROOT, assert_one_line_error, run_cli
from tests.pipeline.media import make_video, no_decoder_model, tiny_detector

cv2 = pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

TIMEOUT = 90


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli-media")
    garbage = root / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(1).integers(0, 255, 8192, dtype=np.uint8).tobytes())
    blocker = root / "a-file"
    blocker.write_text("a file where a folder should be")
    return {
        "root": root,
        "video": make_video(root / "v.avi", frames=30, size=(96, 64)),
        "model": tiny_detector(root / "tiny.onnx"),
        "nodecoder": no_decoder_model(root / "features.onnx"),
        "garbage": garbage,
        "blocker": blocker,
    }


# -- bad input: one line, exit 1, no traceback, no hang -------------------------------------------


def test_missing_video(media: dict[str, Path]) -> None:
    r = run_cli("run", "--model", str(media["model"]), "--source", str(media["root"] / "nope.mp4"), timeout=TIMEOUT)
    assert_one_line_error(r, "video file not found")


def test_unreadable_video(media: dict[str, Path]) -> None:
    r = run_cli("run", "--model", str(media["model"]), "--source", str(media["garbage"]), timeout=TIMEOUT)
    assert_one_line_error(r, "garbage.mp4")


def test_model_whose_outputs_match_no_decoder(media: dict[str, Path]) -> None:
    r = run_cli("run", "--model", str(media["nodecoder"]), "--source", str(media["video"]), timeout=TIMEOUT)
    assert_one_line_error(r, "match no detection decoder")


@pytest.mark.parametrize("sink", ["{blocker}/out.mp4", "jsonl://{blocker}/events.jsonl"])
def test_sink_path_that_cannot_be_written(media: dict[str, Path], sink: str) -> None:
    r = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]),
                "--sink", sink.format(blocker=media["blocker"]), timeout=TIMEOUT)
    assert_one_line_error(r, "cannot write")


def test_missing_model_and_missing_source(media: dict[str, Path]) -> None:
    assert_one_line_error(run_cli("run", "--source", str(media["video"]), timeout=TIMEOUT), "no model given")
    assert_one_line_error(run_cli("run", "--model", str(media["model"]), timeout=TIMEOUT), "no source given")
    assert_one_line_error(run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]),
                                  "--conf", "2", timeout=TIMEOUT), "--conf")


def test_speech_tasks_run_the_speech_chain_in_the_one_pipeline(media: dict[str, Path], tmp_path: Path) -> None:
    r = run_cli("run", "--task", "vad", "--source", str(tmp_path / "missing.wav"), timeout=TIMEOUT)
    # The speech processor opened (not the detector): its one-line error about the missing stage model.
    assert_one_line_error(r, "no model for the vad stage")
    # A video with a speech task, and an audio file with detection: one line naming the source.
    wav = tmp_path / "a.wav"
    wav.write_bytes(b"")
    assert_one_line_error(run_cli("run", "--model", str(media["model"]), "--source", str(wav), timeout=TIMEOUT),
                          "a.wav", "an audio source")


# -- output ---------------------------------------------------------------------------------------


def test_jsonl_has_every_frame_and_json_summary(media: dict[str, Path], tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    r = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]),
                "--sink", f"jsonl://{events}", "--json", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    lines = events.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [rec["frame"] for rec in records] == list(range(30))
    assert all(len(rec["detections"]) == 1 and rec["detections"][0]["class_name"] == "class0" for rec in records)
    ts = [rec["timestamp"] for rec in records]
    assert ts == sorted(ts) and ts[0] > 1.6e9
    summary = json.loads(r.stdout)
    assert summary["frames"] == 30 and summary["fps"] > 0 and summary["dropped"] == 0
    assert summary["detections_per_class"] == {"class0": 30}
    assert {"capture", "preprocess", "infer", "postprocess", "sinks", "total"} <= set(summary["latency_ms"])


def test_jsonl_to_stdout_with_config_and_flag_overrides(media: dict[str, Path], tmp_path: Path) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"model:\n  path: {media['model']}\n"
        f"source:\n  uri: {media['video']}\n"
        "decode:\n  conf: 0.95\n"  # above the tiny model's 0.9: nothing would be found...
        "sinks: [out-from-config.mp4]\n"
    )
    r = run_cli("run", "--config", str(config), "--conf", "0.5", "--sink", "jsonl://-", "--max-frames", "12",
                "--json", timeout=TIMEOUT, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]  # stdout holds the events only
    assert len(records) == 12 and all(len(rec["detections"]) == 1 for rec in records)  # ...--conf 0.5 wins
    assert not (tmp_path / "out-from-config.mp4").exists()  # --sink replaced the config's sinks
    summary = json.loads(r.stderr[r.stderr.index("{"):])
    assert summary["frames"] == 12 and summary["stopped_by"] == "max_frames"


def test_annotated_video_sink(media: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "annotated.avi"
    r = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]), "--sink", str(out),
                timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert "frames     30" in r.stdout
    cap = cv2.VideoCapture(str(out))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    assert len(frames) == 30
    # The box (x 36..60, y 21..46 in the 96x64 frame) is drawn: its outline differs from the plain frame.
    plain = cv2.VideoCapture(str(media["video"])).read()[1]
    assert np.abs(frames[0][21:47, 36:61].astype(int) - plain[21:47, 36:61]).max() > 60


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_and_flushes(media: dict[str, Path], tmp_path: Path, sig: signal.Signals) -> None:
    events, video = tmp_path / "events.jsonl", tmp_path / "out.mp4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgert.cli.main", "run", "--model", str(media["model"]), "--source",
         str(media["video"]), "--loop", "--sink", f"jsonl://{events}", "--sink", str(video), "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not events.exists() or events.stat().st_size < 2000):
            time.sleep(0.1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    summary = json.loads(out)
    assert summary["stopped_by"] == sig.name
    text = events.read_text()
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]  # every line whole
    assert len(lines) == summary["frames"]  # every finished frame reached the sink
    cap = cv2.VideoCapture(str(video))  # the video is finalised and has exactly those frames
    written = 0
    while cap.read()[0]:
        written += 1
    cap.release()
    assert written == summary["frames"] and summary["drops"] == {}


# -- demo -----------------------------------------------------------------------------------------


def test_demo_without_assets_is_one_line(tmp_path: Path) -> None:
    r = run_cli("demo", env={"EDGERT_ASSETS": str(tmp_path / "no-assets")}, timeout=TIMEOUT)
    assert_one_line_error(r, "demo assets not found", "EDGERT_ASSETS")


def test_demo_on_the_assets(assets: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.mp4"
    r = run_cli("demo", "--max-frames", "12", "--out", str(out), "--json",
                env={"EDGERT_ASSETS": str(assets)}, timeout=180)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["frames"] == 12 and summary["detections_per_class"].get("person", 0) >= 12
    cap = cv2.VideoCapture(str(out))
    assert cap.isOpened() and int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 12


def test_image_folder_with_mixed_sizes_into_video_and_jsonl(media: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for i, (h, w) in enumerate([(64, 96), (120, 80), (50, 50)]):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((h, w, 3), 40 * i, np.uint8))
    (folder / "3.jpg").write_bytes(b"broken")
    events, video = tmp_path / "e.jsonl", tmp_path / "o.avi"
    r = run_cli("run", "--model", str(media["model"]), "--source", str(folder), "--sink", f"jsonl://{events}",
                "--sink", str(video), "--json", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    files = [Path(json.loads(line)["file"]).name for line in events.read_text().splitlines()]
    assert files == ["0.png", "1.png", "2.png"]
    summary = json.loads(r.stdout)  # an image that does not decode is counted as such, not as a drop
    assert summary["undecodable"] == {"unreadable_image": 1} and summary["drops"] == {}
    cap = cv2.VideoCapture(str(video))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 3 and int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)) == 96


def test_killed_process_leaves_only_whole_jsonl_lines(media: dict[str, Path], tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgert.cli.main", "run", "--model", str(media["model"]), "--source",
         str(media["video"]), "--loop", "--sink", f"jsonl://{events}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not events.exists() or events.stat().st_size < 5000):
            time.sleep(0.05)
        proc.kill()  # SIGKILL: no handler, no flush, no close
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = events.read_text()
    assert text.endswith("\n")
    frames = [json.loads(line)["frame"] for line in text.splitlines()]
    assert frames == list(range(len(frames))) and len(frames) > 10


def test_metrics_flag_serves_prometheus_while_running(media: dict[str, Path]) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:  # a free port (released just before edgert binds it)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgert.cli.main", "run", "--model", str(media["model"]), "--source",
         str(media["video"]), "--loop", "--metrics", f"127.0.0.1:{port}", "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        text, deadline = "", time.monotonic() + 60
        while time.monotonic() < deadline and "\nedgert_ready 1" not in text:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "\nedgert_ready 1" in text and "\nedgert_frames_total" in text, text
    assert proc.returncode == 0 and json.loads(out)["frames"] > 0, err


def test_a_second_signal_stops_within_a_second_even_with_a_long_queue(assets: Path, tmp_path: Path) -> None:
    """64 frames in flight on a real detector take seconds to drain; a second SIGTERM must not wait for them."""
    events = tmp_path / "e.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgert.cli.main", "run", "--model",
         str(assets / "models" / "detection" / "nanodet-m-416-coco-v8layout.onnx"), "--source",
         str(assets / "video" / "vtest.avi"), "--loop", "--queue-size", "64", "--sink", f"jsonl://{events}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not events.exists() or events.stat().st_size < 1000):
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.7)  # a copy within 0.5 s counts as the same signal
        second = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        stopped_after = time.monotonic() - second
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stopped_after < 2.5, stopped_after  # a second on a quiet machine; slack for a loaded CI box
    text = events.read_text()
    assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())


def test_classes_flag_keeps_the_named_classes(tmp_path: Path) -> None:
    from edgert.demo_files import demo_files

    files = demo_files(tmp_path / "demo")
    base = ("run", "--model", str(files.model), "--source", str(files.photos), "--json")
    everything = run_cli(*base)
    assert everything.returncode == 0, everything.stderr
    per_class = json.loads(everything.stdout)["detections_per_class"]
    assert "person" in per_class and "car" in per_class and len(per_class) > 2
    for flag in ("person,car", "0,2", "Person,2"):
        r = run_cli(*base, "--classes", flag)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["detections_per_class"] == {k: per_class[k] for k in ("person", "car")}
    assert_one_line_error(run_cli(*base, "--classes", "pers"), "--classes: no class named 'pers'; close: person")
