"""Issue 25, case 1: a camera's password never leaves the process.

A real run of the CLI with a credentialed RTSP source (an unreachable one on loopback: it fails to open, is
retried, and every message about it is written) beside a real video, through every output a URI reaches:
the log (stderr: open errors, retries), the ``--json`` summary, the HTML report, the Prometheus endpoint,
the web preview's page, /stats.json and /sources.json; and the systemd unit rendered for such a config.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.faults.conftest import closed_port, free_port, start_cli, stop, summary_of, wait_http
from tests.helpers import assert_one_line_error, run_cli

USER, PASSWORD, TOKEN = "admin", "Sup3rSecretPW", "T0kenSecret"


def _config(tmp_path: Path, media: dict[str, Path], cam_uri: str) -> Path:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        f"model: {{path: {media['model']}}}\n"
        "sources:\n"
        f"  - {{uri: '{cam_uri}', name: cam, timeout_s: 1.5}}\n"
        f"  - {{uri: '{media['long']}', name: door, loop: true}}\n"
        f"sinks: ['jsonl://{tmp_path}/{{source}}.jsonl', 'http://127.0.0.1:{free_port()}']\n", encoding="utf-8")
    return cfg


def _no_secret(where: str, text: str) -> None:
    for secret in (PASSWORD, TOKEN):
        assert secret not in text, f"{secret} leaks in {where}: {text[:2000]}"


def test_a_credentialed_source_leaks_through_no_output(tmp_path: Path, media: dict[str, Path]) -> None:
    cam = f"rtsp://{USER}:{PASSWORD}@127.0.0.1:{closed_port()}/stream?token={TOKEN}"
    cfg = _config(tmp_path, media, cam)
    preview = cfg.read_text().split("'http://")[1].split("'")[0]
    metrics = f"127.0.0.1:{free_port()}"
    report = tmp_path / "report.html"
    proc = start_cli("-v", "run", "--config", str(cfg), "--json", "--metrics", metrics, "--report", str(report))
    try:
        scraped = {
            "metrics": wait_http(f"http://{metrics}/metrics", proc, needle="edgert_info"),
            "page": wait_http(f"http://{preview}/", proc),
            "stats": wait_http(f"http://{preview}/stats.json", proc),
            "sources": wait_http(f"http://{preview}/sources.json", proc),
        }
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    for where, text in scraped.items():
        _no_secret(where, text)
    _no_secret("the log", err)
    _no_secret("the --json summary", out)
    _no_secret("the report", report.read_text(encoding="utf-8"))
    # ... and what is shown still says which camera it was, and why it is missing.
    summary = summary_of(out)
    camera = next(s for s in summary["sources"] if s["name"] == "cam")
    assert camera["reconnecting"] and "***@127.0.0.1" in camera["uri"] and "cannot open" in camera["start_error"]
    assert "token=***" in camera["uri"]
    assert "***@127.0.0.1" in err and "retrying" in err and "reconnecting in" in err


def test_the_unit_never_holds_a_source_password(tmp_path: Path, media: dict[str, Path]) -> None:
    literal = tmp_path / "literal.yaml"
    literal.write_text(f"model: {{path: {media['model']}}}\n"
                       f"source: {{uri: 'rtsp://{USER}:{PASSWORD}@10.0.0.7/stream'}}\n", encoding="utf-8")
    refused = run_cli("service", "install", "--config", str(literal), "--name", "cam", "--dry-run")
    assert_one_line_error(refused, "credentials do not belong in the config", "EnvironmentFile")
    _no_secret("the refusal", refused.stderr + refused.stdout)

    named = tmp_path / "named.yaml"
    named.write_text(f"model: {{path: {media['model']}}}\n"
                     "source: {uri: 'rtsp://${CAM_USER}:${CAM_PASSWORD}@10.0.0.7/stream'}\n", encoding="utf-8")
    unit = run_cli("service", "install", "--config", str(named), "--name", "cam", "--dry-run",
                   env={"CAM_PASSWORD": PASSWORD, "CAM_USER": USER})
    assert unit.returncode == 0, unit.stderr
    _no_secret("the unit", unit.stdout)
    description = "Description=edgert pipeline cam (t.onnx on rtsp://${CAM_USER}:${CAM_PASSWORD}@10.0.0.7/stream)"
    assert description in unit.stdout
    assert "EnvironmentFile=-/etc/edgert/cam.env" in unit.stdout


def test_credentials_named_in_the_uri_come_from_the_environment(tmp_path: Path, media: dict[str, Path]) -> None:
    cam = f"rtsp://${{CAM_USER}}:${{CAM_PASSWORD}}@127.0.0.1:{closed_port()}/stream"
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsource: {{uri: '{cam}', timeout_s: 0.5}}\n", encoding="utf-8")
    unset = run_cli("run", "--config", str(cfg), env={"CAM_USER": USER})
    assert_one_line_error(unset, "${CAM_PASSWORD}, which is not set in the environment")
    down = run_cli("run", "--config", str(cfg), env={"CAM_USER": USER, "CAM_PASSWORD": PASSWORD})
    assert_one_line_error(down, "rtsp://${CAM_USER}:${CAM_PASSWORD}@127.0.0.1", "cannot open")
    _no_secret("the error", down.stderr)


def test_edgert_config_prints_no_secret(tmp_path: Path, media: dict[str, Path]) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   f"source: {{uri: 'rtsp://{USER}:{PASSWORD}@10.0.0.7:554/stream?token={TOKEN}', name: door}}\n"
                   f"sinks: ['mqtt://bob:{PASSWORD}@127.0.0.1:1883/edgert/{{source}}?password={TOKEN}']\n",
                   encoding="utf-8")
    for flags in ((), ("--json",)):
        shown = run_cli("config", str(cfg), *flags)
        assert shown.returncode == 0, shown.stderr
        _no_secret(f"edgert config {' '.join(flags)}", shown.stdout + shown.stderr)
        # ... still naming the camera and the broker
        assert "rtsp://***@10.0.0.7:554/stream?token=***" in shown.stdout
        assert "mqtt://***@127.0.0.1:1883/edgert/{source}?password=***" in shown.stdout


def test_a_working_credentialed_camera_leaks_through_no_payload_nor_c_library_line(
        tmp_path: Path, media: dict[str, Path], late_server: tuple[int, threading.Event]) -> None:
    """The camera delivers frames (an HTTP stream: FFmpeg sends its user info as basic auth) to JSONL and a real
    mosquitto; OpenCV is asked to echo every URI it opens (``OPENCV_VIDEOIO_DEBUG``: a C library writing to
    fd 2, past logging): the MQTT payloads, the JSONL, the log and the summary hold no secret."""
    from tests.faults.test_mqtt import MOSQUITTO, Broker, _free_port

    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    mqtt = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is not installed (pip install 'edgert[mqtt]')")
    port, go = late_server
    go.set()
    folder = tmp_path / "broker"
    folder.mkdir()
    broker = Broker(folder, _free_port())
    broker.start()
    payloads: list[bytes] = []
    ready = threading.Event()
    client = (mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="edgert-secrets-listener")
              if hasattr(mqtt, "CallbackAPIVersion") else mqtt.Client(client_id="edgert-secrets-listener"))
    client.on_connect = lambda c, *rest: c.subscribe("#", qos=1)
    client.on_subscribe = lambda *args: ready.set()
    client.on_message = lambda c, u, message: payloads.append(message.topic.encode() + b" " + message.payload)
    try:
        client.connect("127.0.0.1", broker.port)
        client.loop_start()
        assert ready.wait(10)
        cam = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/{media['long'].name}?token={TOKEN}"
        cfg = tmp_path / "p.yaml"
        cfg.write_text(f"model: {{path: {media['model']}}}\n"
                       f"source: {{uri: '{cam}', name: cam}}\nruntime: {{max_frames: 20}}\n"
                       f"sinks: ['jsonl://{tmp_path}/cam.jsonl', 'mqtt://127.0.0.1:{broker.port}/edgert/cam']\n",
                       encoding="utf-8")
        proc = run_cli("-v", "run", "--config", str(cfg), "--json", env={"OPENCV_VIDEOIO_DEBUG": "1"})
        assert proc.returncode == 0, proc.stderr
        deadline = time.monotonic() + 20
        while len(payloads) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.disconnect()
        client.loop_stop()
        broker.stop()
    assert len(payloads) >= 20
    _no_secret("the MQTT payloads", b"\n".join(payloads).decode("utf-8", "replace"))
    _no_secret("the JSONL", (tmp_path / "cam.jsonl").read_text(encoding="utf-8"))
    _no_secret("the --json summary", proc.stdout)
    _no_secret("stderr, C libraries' lines included", proc.stderr)
    # OpenCV did echo the URI on fd 2, and it came out redacted
    assert f"trying capture filename='http://***@127.0.0.1:{port}/{media['long'].name}?token=***'" in proc.stderr
