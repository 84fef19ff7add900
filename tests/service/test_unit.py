"""Unit rendering: what each kind of pipeline implies, and systemd's own verifier on the result."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgert.config import PipelineConfig, from_mapping, load_config
from edgert.errors import ServiceError
from edgert.service.unit import (
    DEFAULT_DEVICE_ALLOW,
    UnitOptions,
    discover_device_allow,
    render_unit,
    source_needs,
    template_text,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "jetson" / "camera.yaml"
EXAMPLE_UNIT = ROOT / "jetson" / "edgert-camera.service"
EXAMPLE_OPTIONS = UnitOptions(name="camera", config_path="/etc/edgert/camera.yaml",
                              edgert="/opt/edgert/venv/bin/edgert")


def _edgert_here() -> str:
    exe = Path(sys.prefix) / "bin" / "edgert"
    if not exe.exists():
        pytest.skip("the edgert command is not installed in this environment (pip install -e .)")
    return str(exe)


def _config(**data: object) -> PipelineConfig:
    return from_mapping(PipelineConfig, data)


def _keys(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split("=", 1)) for line in text.splitlines()  # type: ignore[misc]
            if "=" in line and not line.startswith("#")]


def _values(text: str, key: str) -> list[str]:
    return [v for k, v in _keys(text) if k == key]


def verify(unit: Path) -> None:
    """Run `systemd-analyze verify` and fail on any complaint about this unit (warnings included)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian/Ubuntu: apt-get install systemd)")
    proc = subprocess.run([tool, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    ours = [line for line in proc.stderr.splitlines() if unit.name in line or str(unit) in line]
    assert proc.returncode == 0 and not ours, proc.stderr


def test_csi_pipeline_unit_has_every_required_setting(tmp_path: Path) -> None:
    edgert = _edgert_here()
    config = load_config(EXAMPLE_CONFIG)
    text = render_unit(config, UnitOptions(name="camera", config_path=str(EXAMPLE_CONFIG), edgert=edgert,
                                           metrics="127.0.0.1:9400"))
    unit = tmp_path / "edgert-camera.service"
    unit.write_text(text)
    verify(unit)
    one = {k: v for k, v in _keys(text)}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert one["WatchdogSec"] == "30" and one["Restart"] == "on-failure"
    assert one["StartLimitIntervalSec"] == "180" and one["StartLimitBurst"] == "12" and one["RestartSec"] == "10"
    environment = " ".join(_values(text, "Environment")).split()
    assert one["TimeoutStopSec"] == "30" and "EDGERT_STOP_DEADLINE_S=15" in environment
    assert _values(text, "After") == ["nvargus-daemon.service"] == _values(text, "Wants")
    assert one["EnvironmentFile"] == "-/etc/edgert/camera.env"
    assert one["User"] == "edgert" and one["Group"] == "edgert" and one["SupplementaryGroups"] == "video render"
    assert one["NoNewPrivileges"] == "yes" and one["ProtectSystem"] == "strict" and one["ProtectHome"] == "yes"
    assert one["PrivateTmp"] == "no"  # libargus needs nvargus-daemon's /tmp/argus_socket
    assert _values(text, "ReadWritePaths") == ["-/srv/edgert/camera"]
    assert one["DevicePolicy"] == "closed"
    allowed = _values(text, "DeviceAllow")
    assert "char-video4linux rw" in allowed and "/dev/nvmap rw" in allowed and "/dev/nvhost-ctrl-gpu rw" in allowed
    model = "/opt/edgert/models/nanodet-m-416-coco-v8layout.onnx"
    engine = "/var/cache/edgert/camera/nanodet-m-416-coco-v8layout.engine"
    assert _values(text, "ExecStartPre") == [
        f"{edgert} build {model} --backend tensorrt --precision fp16 -o {engine}"]
    assert one["ExecStart"] == f"{edgert} run --config {EXAMPLE_CONFIG} --model {engine} --metrics 127.0.0.1:9400"
    assert ("EDGERT_CACHE_DIR=/var/cache/edgert/camera CUDA_CACHE_PATH=/var/cache/edgert/camera/cuda"
            in _values(text, "Environment"))


def test_hardening_keeps_the_exposure_score_low(tmp_path: Path) -> None:
    """systemd's own offline security review of the example unit: 3.6 ("OK") when written; fail above 4.0."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian/Ubuntu: apt-get install systemd)")
    unit = tmp_path / EXAMPLE_UNIT.name
    shutil.copy(EXAMPLE_UNIT, unit)
    proc = subprocess.run([tool, "security", "--offline=yes", "--threshold=40", "--no-pager", str(unit)],
                          capture_output=True, text=True, timeout=60)
    if "Unknown option" in proc.stderr or "unrecognized option" in proc.stderr:
        pytest.skip("this systemd-analyze has no offline security review (systemd < 250)")
    assert proc.returncode == 0, proc.stdout[-400:] + proc.stderr


def test_rtsp_pipeline_waits_for_the_network_and_keeps_tmp_private(tmp_path: Path) -> None:
    edgert = _edgert_here()
    config = _config(model={"path": "/home/op/models/m.onnx"}, source={"uri": "rtsp://cam.local:554/stream"},
                     sinks=["jsonl://relative/out.jsonl", "out/annotated.mp4", "/data/clips/annotated.mp4"])
    text = render_unit(config, UnitOptions(name="gate-2", config_path="/home/op/gate.yaml", edgert=edgert))
    unit = tmp_path / "edgert-gate-2.service"
    unit.write_text(text)
    verify(unit)
    assert _values(text, "After") == ["network-online.target"] == _values(text, "Wants")
    assert _values(text, "PrivateTmp") == ["yes"]
    assert _values(text, "ProtectHome") == ["read-only"]  # model and config live in a home directory
    assert _values(text, "ReadWritePaths") == ["-/data/clips"]  # relative outputs go to the StateDirectory
    assert _values(text, "WorkingDirectory") == ["/var/lib/edgert/gate-2"]
    assert _values(text, "ExecStartPre") == []  # onnxruntime (auto) builds nothing


def test_file_pipeline_with_odd_paths_is_quoted(tmp_path: Path) -> None:
    edgert = _edgert_here()
    config = _config(model={"path": "/srv/models/m.onnx", "backend": "tensorrt", "engine_cache": "/srv/engines"},
                     source={"uri": "/srv/in/video.avi"}, sinks=["jsonl:///srv/out/d.jsonl"])
    cfg_dir = tmp_path / "my configs"
    text = render_unit(config, UnitOptions(name="odd", config_path=f"{cfg_dir}/100%.yaml", edgert=edgert))
    unit = tmp_path / "edgert-odd.service"
    unit.write_text(text)
    verify(unit)
    assert _values(text, "After") == []
    assert _values(text, "ReadWritePaths") == ["-/srv/engines", "-/srv/out"]
    assert f'"{cfg_dir}/100%%.yaml"' in _values(text, "ExecStart")[0]
    assert _values(text, "ExecStartPre")[0].endswith("-o /srv/engines/m.engine")


def test_the_rendered_unit_is_what_systemd_would_reject_when_broken(tmp_path: Path) -> None:
    """The verifier is a real check: a unit with a missing executable fails it."""
    config = _config(model={"path": "/srv/m.onnx"}, source={"uri": "/srv/v.avi"})
    unit = tmp_path / "edgert-broken.service"
    unit.write_text(render_unit(config, UnitOptions(name="broken", config_path="/srv/c.yaml",
                                                    edgert="/nonexistent/bin/edgert")))
    with pytest.raises(AssertionError, match="is not executable"):
        verify(unit)


@pytest.mark.parametrize(("uri", "needs"), [
    ("csi://0", {"argus"}), ("gst://nvarguscamerasrc ! appsink", {"argus"}), ("rtsp://h/s", {"network"}),
    ("https://h/s.m3u8", {"network"}), ("gst://rtspsrc location=rtsp://h ! appsink", {"network"}),
    ("v4l2:///dev/video1", set()), ("/dev/video0", set()), ("0", set()), ("in/*.jpg", set()),
    ("clip.mp4", set()),
])
def test_source_rows_say_what_each_source_needs(uri: str, needs: set[str]) -> None:
    assert source_needs(_config(source={"uri": uri})) == needs


def test_speech_pipelines_get_the_watchdog_they_feed(tmp_path: Path) -> None:
    """A speech run goes through the one Pipeline: READY=1 and WATCHDOG=1 as detection (and from Whisper's decoder
    steps inside a long window: tests/speech/test_one_pipeline.py)."""
    config = _config(task="wakeword", model={"path": "/srv/m.onnx"}, source={"uri": "alsa://default"})
    text = render_unit(config, UnitOptions(name="ears", config_path="/srv/c.yaml", edgert=_edgert_here(),
                                           watchdog_s=20))
    unit = tmp_path / "edgert-ears.service"
    unit.write_text(text)
    verify(unit)
    assert _values(text, "Type") == ["notify"]
    assert _values(text, "WatchdogSec") == ["20"] and _values(text, "NotifyAccess") == ["main"]


def test_service_install_dry_run_for_a_speech_config_has_the_watchdog(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    config = tmp_path / "ears.yaml"
    config.write_text("task: asr\nmodel:\n  path: /srv/whisper-tiny.en\nsource:\n  uri: alsa://default\n"
                      "speech:\n  chain: [vad, asr]\n  vad:\n    model: /srv/silero_vad.onnx\n"
                      "sinks: [\"mqtt://127.0.0.1:1883/ears?events=only\"]\n")
    r = run_cli("service", "install", "--config", str(config), "--name", "ears", "--dry-run",
                "--unit-dir", str(tmp_path / "units"), "--edgert", _edgert_here())
    assert r.returncode == 0, r.stderr
    assert _values(r.stdout, "Type") == ["notify"] and _values(r.stdout, "WatchdogSec") == ["30"]
    assert not (tmp_path / "units").exists()


def test_rtsp_output_also_waits_for_the_network() -> None:
    config = _config(model={"path": "/m.onnx"}, source={"uri": "/dev/video0"}, sinks=["rtsp://mediamtx:8554/out"])
    text = render_unit(config, UnitOptions(name="pub", config_path="/c.yaml", edgert="/usr/bin/edgert"))
    assert _values(text, "After") == ["network-online.target"]


@pytest.mark.parametrize(("options", "message"), [
    (UnitOptions(name="bad name", config_path="/c.yaml", edgert="/e"), "service name"),
    (UnitOptions(name="x", config_path="c.yaml", edgert="/e"), "must be absolute"),
    (UnitOptions(name="x", config_path="/c.yaml", edgert="edgert"), "must be absolute"),
    (UnitOptions(name="x", config_path="/c.yaml", edgert="/e", watchdog_s=0), "positive"),
])
def test_bad_options_are_service_errors(options: UnitOptions, message: str) -> None:
    with pytest.raises(ServiceError, match=message):
        render_unit(_config(), options)


def test_jetson_example_unit_is_rendered_from_the_packaged_template() -> None:
    """jetson/edgert-camera.service is generated; the template in the package is the one source."""
    text = render_unit(load_config(EXAMPLE_CONFIG), EXAMPLE_OPTIONS)
    if os.environ.get("EDGERT_WRITE_EXAMPLE") == "1":
        EXAMPLE_UNIT.write_text(text)
    assert EXAMPLE_UNIT.read_text() == text, (
        "jetson/edgert-camera.service is out of date: EDGERT_WRITE_EXAMPLE=1 pytest tests/service/test_unit.py")
    assert "@NAME@" in template_text()


def test_jetson_env_example_is_the_packaged_one() -> None:
    from importlib import resources

    packaged = (resources.files("edgert.service") / "templates" / "edgert.env").read_text()
    assert (ROOT / "jetson" / "edgert.env").read_text() == packaged


def test_device_discovery_uses_groups_and_falls_back_to_nodes(tmp_path: Path) -> None:
    # This machine's real nodes: /dev/null is in the broad 'mem' group, so it is allowed by path.
    assert discover_device_allow(["/dev/null", "/dev/does-not-exist*"]) == ["/dev/null rw"]
    # With a driver group of its own, a node is allowed by group (covers nodes plugged in later).
    proc_devices = tmp_path / "devices"
    proc_devices.write_text(f"Character devices:\n  {os.major(os.stat('/dev/null').st_rdev)} fakecam\n\n"
                            "Block devices:\n  7 loop\n")
    assert discover_device_allow(["/dev/null", "/dev/zero"], str(proc_devices)) == ["char-fakecam rw"]
    assert discover_device_allow([str(proc_devices)]) == []  # a regular file is no device
    assert "char-video4linux rw" in DEFAULT_DEVICE_ALLOW


def test_exec_start_pre_builds_once_then_reuses_the_engine(tmp_path: Path) -> None:
    """The unit's own ExecStartPre line, run twice as two service starts would run it (TensorRT-RTX on CPU)."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds engines on CPU: pip install 'edgert[rtx]'")
    import shlex

    from tests.helpers import tiny_model

    edgert = _edgert_here()
    model = tiny_model(tmp_path / "tiny.onnx", shape=(1, 3, 16, 16))
    cache = tmp_path / "engines"
    config = _config(model={"path": str(model), "backend": "tensorrt-rtx", "engine_cache": str(cache)},
                     source={"uri": "/dev/video0"})
    text = render_unit(config, UnitOptions(name="boot", config_path=str(tmp_path / "p.yaml"), edgert=edgert))
    (pre,) = _values(text, "ExecStartPre")
    assert f"--model {cache}/tiny.engine" in _values(text, "ExecStart")[0]
    env = {**os.environ, "EDGERT_CACHE_DIR": str(tmp_path / "timing")}
    first = subprocess.run(shlex.split(pre), capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("built ") and (cache / "tiny.engine").exists()
    second = subprocess.run(shlex.split(pre), capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0 and second.stdout.startswith("reused cached engine"), second.stdout


@pytest.mark.parametrize(("data", "message"), [
    ({"model": {"path": "m.onnx"}, "source": {"uri": "/dev/video0"}}, "model.path 'm.onnx' is relative"),
    ({"model": {"path": "/m.onnx", "engine_cache": "engines"}, "source": {"uri": "0"}}, "model.engine_cache"),
    ({"model": {"path": "/m.onnx"}, "source": {"uri": "clips/in.mp4"}}, "source.uri 'clips/in.mp4' is relative"),
    ({"model": {"path": "/m.onnx"}, "source": {"uri": "file://in.mp4"}}, "source.uri 'file://in.mp4'"),
])
def test_relative_inputs_are_refused(data: dict, message: str) -> None:
    """A service runs in its state directory: relative inputs would silently point there."""
    with pytest.raises(ServiceError, match=message):
        render_unit(_config(**data), UnitOptions(name="x", config_path="/c.yaml", edgert="/usr/bin/edgert"))
