"""MQTT sink against a real mosquitto on loopback, with a real persistent paho subscriber.

The broker is started by the test (a temporary config, persistence on, a free port on 127.0.0.1) and
stopped with SIGTERM, which makes mosquitto save the subscriber's session and its queued messages; the
subscriber uses a persistent session (clean_session False, QoS 1), as a fleet's consumer would.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.errors import SinkError
from edgert.io.sinks import FrameResult, SinkWorker, StreamInfo, open_sink
from edgert.io.sinks.mqtt import MqttSink
from edgert.vision.detections import Detections
from tests.helpers import assert_one_line_error, run_cli

mqtt = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is not installed (pip install 'edgert[mqtt]')")

MOSQUITTO = shutil.which("mosquitto") or next(
    (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()), None)
needs_broker = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto is not installed (apt-get install mosquitto)")

INFO = StreamInfo(96, 64, 10.0, ("person", "car"))
TOPIC = "edgert/test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """One mosquitto process on 127.0.0.1:port, restartable with the same persistence file."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        self.conf = folder / "mosquitto.conf"
        # user: mosquitto started as root switches to the user "mosquitto", which could not write the
        # persistence file (and the log) in this folder; the current user keeps it writable.
        self.conf.write_text(
            f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
            f"persistence_location {folder}/\nautosave_interval 1\nmax_queued_messages 0\n"
            f"log_dest file {folder}/mosquitto.log\n", encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert MOSQUITTO is not None
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mosquitto exited: {(self.folder / 'mosquitto.log').read_text()}") from None
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not listen within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # mosquitto saves its persistence file on SIGTERM
            self.proc.wait(10)
        self.proc = None


class Subscriber:
    """A persistent-session QoS 1 subscriber that collects every payload it gets."""

    def __init__(self, port: int, client_id: str = "edgert-test-sub") -> None:
        self.port = port
        self.messages: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        if hasattr(mqtt, "CallbackAPIVersion"):
            self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        else:
            self.client = mqtt.Client(client_id=client_id, clean_session=False)
        self.client.on_connect = lambda c, u, f, rc, *rest: c.subscribe(TOPIC, qos=1)
        self.client.on_subscribe = lambda *args: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(1, 2)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._lock:
            self.messages.append(json.loads(message.payload))

    def start(self) -> Subscriber:
        self.client.connect_async("127.0.0.1", self.port)
        self.client.loop_start()
        assert self._subscribed.wait(10), "the subscriber did not subscribe"
        return self

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def frames(self) -> list[int]:
        with self._lock:
            return [m["frame"] for m in self.messages if "frame" in m and "type" not in m]

    def wait_for(self, count: int, timeout: float = 20.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(set(self.frames())) < count:
            time.sleep(0.05)
        return self.frames()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    b = Broker(tmp_path, _free_port())
    yield b
    b.stop()


def _register_session(broker: Broker) -> None:
    """Make the subscriber's persistent session exist on the broker, then leave it offline."""
    broker.start()
    sub = Subscriber(broker.port).start()
    sub.stop()


def _result(i: int, events: list[dict[str, Any]] | None = None) -> FrameResult:
    det = Detections(np.array([[1.0, 2.0, 30.0, 40.0]]), np.array([0.9]), np.array([0]), ("person",),
                     track_id=np.array([7]))
    return FrameResult(i, 1700000000.0 + i, det, events=events or [])


@needs_broker
def test_broker_down_at_start_then_up_3s_later_loses_nothing(broker: Broker) -> None:
    _register_session(broker)
    broker.stop()
    sink = MqttSink.from_uri(f"mqtt://127.0.0.1:{broker.port}/{TOPIC}?close_timeout=30")
    sink.open(INFO)
    started = time.monotonic()
    for i in range(30):
        sink.write(_result(i))
        time.sleep(0.02)
    assert not sink.connected and sink.pending == 30
    time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))
    broker.start()
    sub = Subscriber(broker.port).start()
    try:
        sink.close()  # waits for every acknowledgement
        frames = sub.wait_for(30)
    finally:
        sub.stop()
    assert sorted(set(frames)) == list(range(30)), frames
    assert sink.dropped == 0 and sink.published >= 30 and sink.connects == 1


@needs_broker
def test_broker_gone_mid_run_and_back_loses_nothing(broker: Broker) -> None:
    broker.start()
    sub = Subscriber(broker.port).start()
    sink = MqttSink.from_uri(f"mqtt://127.0.0.1:{broker.port}/{TOPIC}?close_timeout=30")
    sink.open(INFO)
    try:
        deadline = time.monotonic() + 10
        while not sink.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        events = [{"type": "line_cross", "line": "door", "track_id": 7, "class": "person", "direction": "in",
                   "time": 1.0, "frame": 5}]
        for i in range(20):
            sink.write(_result(i, events if i == 5 else None))
        assert len(set(sub.wait_for(20))) == 20
        broker.stop()
        for i in range(20, 40):  # the broker is away: these wait in the queue
            sink.write(_result(i))
            time.sleep(0.02)
        broker.start()
        for i in range(40, 60):
            sink.write(_result(i))
        sink.close()
        frames = sub.wait_for(60)
        crossings = [m for m in sub.messages if m.get("type") == "line_cross"]
    finally:
        sub.stop()
    assert sorted(set(frames)) == list(range(60)), sorted(set(range(60)) - set(frames))
    assert sink.dropped == 0 and sink.connects == 2
    assert crossings and crossings[0]["track_id"] == 7 and crossings[0]["direction"] == "in"
    first = next(m for m in sub.messages if m.get("frame") == 0 and "type" not in m)
    assert first["detections"][0]["track_id"] == 7  # same schema as the JSONL sink


@needs_broker
def test_queue_overflow_is_counted_and_reported_by_the_worker(broker: Broker) -> None:
    _register_session(broker)
    broker.stop()
    sink = MqttSink.from_uri(f"mqtt://127.0.0.1:{broker.port}/{TOPIC}?queue=5&close_timeout=30")
    sink.open(INFO)
    worker = SinkWorker(sink)
    worker.start()
    for i in range(12):
        assert worker.offer(_result(i))
    deadline = time.monotonic() + 5
    while worker.written < 12 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sink.dropped == 7 and worker.dropped == 7  # the pipeline reports worker.dropped as sink drops
    broker.start()
    sub = Subscriber(broker.port).start()
    try:
        worker.close(timeout=30)
        frames = sub.wait_for(5)
        time.sleep(0.5)  # nothing more may arrive
        frames = sub.frames()
    finally:
        sub.stop()
    assert sorted(set(frames)) == [0, 1, 2, 3, 4]


@needs_broker
def test_events_only_sends_events_alone(broker: Broker) -> None:
    broker.start()
    sub = Subscriber(broker.port).start()
    sink = open_sink(f"mqtt://127.0.0.1:{broker.port}/{TOPIC}?events=only&qos=0")
    assert isinstance(sink, MqttSink) and sink.qos == 0 and sink.events_only
    sink.open(INFO)
    try:
        deadline = time.monotonic() + 10
        while not sink.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        event = {"type": "zone_enter", "zone": "z", "track_id": 3, "class": "person", "time": 2.0, "frame": 1}
        for i in range(5):
            sink.write(_result(i, [event] if i == 1 else None))
        sink.close()
        deadline = time.monotonic() + 10
        while not sub.messages and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        sub.stop()
    assert sub.messages == [event]


@pytest.mark.parametrize(("uri", "needle"), [
    ("mqtt://127.0.0.1:1883/edgert/+/x", "wildcard"),
    ("mqtt://127.0.0.1:1883/edgert/#", "wildcard"),
    ("mqtt://127.0.0.1:1883/", "no topic"),
    ("mqtt://bob:secret@127.0.0.1:1883/t", "EDGERT_MQTT_PASSWORD"),
    ("mqtt://127.0.0.1:1883/t?qos=3", "expected 0, 1 or 2"),
    ("mqtt://127.0.0.1:1883/t?events=some", "events="),
    ("mqtt://127.0.0.1:1883/t?colour=red", "valid options are"),
    ("mqtt://127.0.0.1:99999/t", "port"),
])
def test_bad_uris_are_one_line_errors(uri: str, needle: str) -> None:
    with pytest.raises(SinkError) as info:
        open_sink(uri)
    message = str(info.value)
    assert needle in message and "\n" not in message
    assert "secret" not in message  # a password typed into a URI is never echoed


def test_unresolvable_broker_host_fails_at_open() -> None:
    sink = open_sink("mqtt://no-such-broker.invalid:1883/edgert")
    with pytest.raises(SinkError, match=r"cannot resolve the broker host 'no-such-broker\.invalid'"):
        sink.open(INFO)


def test_cli_one_line_errors_for_bad_broker_input(tmp_path: Path) -> None:
    from tests.pipeline.media import make_video, tiny_detector

    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    video = make_video(tmp_path / "v.avi", frames=3, size=(96, 64))
    model = tiny_detector(tmp_path / "tiny.onnx")
    for uri, needle in (("mqtt://no-such-broker.invalid/edgert", "cannot resolve"),
                        ("mqtt://127.0.0.1/edgert/#", "wildcard")):
        result = run_cli("run", "--model", str(model), "--source", str(video), "--sink", uri, timeout=90)
        assert_one_line_error(result, needle)


@needs_broker
@pytest.mark.slow
def test_edgert_run_publishes_every_frame_to_a_broker_that_starts_late(broker: Broker, assets: Path) -> None:
    """The issue's check: the broker is down when `edgert run` starts and comes up 3 s later."""
    pytest.importorskip("onnxruntime")
    _register_session(broker)
    broker.stop()
    model = assets / "models/detection/nanodet-m-416-coco-v8layout.onnx"
    video = assets / "video/vtest.avi"
    cmd = ["run", "--model", str(model), "--source", str(video), "--max-frames", "30", "--json",
           "--sink", f"mqtt://127.0.0.1:{broker.port}/{TOPIC}?close_timeout=60"]
    import sys

    from tests.helpers import ROOT

    proc = subprocess.Popen([sys.executable, "-m", "edgert.cli.main", *cmd], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3.0)
        broker.start()
        sub = Subscriber(broker.port).start()
        try:
            out, err = proc.communicate(timeout=120)
            frames = sub.wait_for(30)
        finally:
            sub.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["frames"] == 30 and not any(k.startswith("sink:") for k in summary["drops"]), summary
    assert sorted(set(frames)) == list(range(30)), frames


OPENSSL = shutil.which("openssl")
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd")


@needs_broker
@pytest.mark.skipif(OPENSSL is None or MOSQUITTO_PASSWD is None,
                    reason="openssl and mosquitto_passwd are needed to make a TLS broker with users")
def test_mqtts_with_credentials_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TLS against a private CA, user and password from EDGERT_MQTT_USERNAME / EDGERT_MQTT_PASSWORD."""
    assert OPENSSL is not None and MOSQUITTO_PASSWD is not None

    def ssl(*args: str) -> None:
        subprocess.run([OPENSSL, *args], check=True, capture_output=True, cwd=tmp_path)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=edgert test CA",
        "-keyout", "ca.key", "-out", "ca.pem")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "san.ext", "-out", "server.pem")
    subprocess.run([MOSQUITTO_PASSWD, "-b", "-c", str(tmp_path / "passwd"), "cam1", "s3cret pass"], check=True,
                   capture_output=True)
    plain, tls = _free_port(), _free_port()
    broker = Broker(tmp_path, plain)
    # The subscriber uses the anonymous plain listener; the sink must log in over TLS.
    broker.conf.write_text(
        f"user {pwd.getpwuid(os.getuid()).pw_name}\nper_listener_settings true\n"
        f"listener {plain} 127.0.0.1\nallow_anonymous true\n"
        f"listener {tls} 127.0.0.1\nallow_anonymous false\npassword_file {tmp_path}/passwd\n"
        f"cafile {tmp_path}/ca.pem\ncertfile {tmp_path}/server.pem\nkeyfile {tmp_path}/server.key\n",
        encoding="utf-8")
    broker.start()
    try:
        sub = Subscriber(plain).start()
        try:
            monkeypatch.setenv("EDGERT_MQTT_USERNAME", "cam1")
            monkeypatch.setenv("EDGERT_MQTT_PASSWORD", "s3cret pass")
            sink = open_sink(f"mqtts://127.0.0.1:{tls}/{TOPIC}?ca={tmp_path}/ca.pem&close_timeout=20")
            sink.open(INFO)
            for i in range(5):
                sink.write(_result(i))
            sink.close()
            assert sorted(set(sub.wait_for(5))) == [0, 1, 2, 3, 4]
            assert isinstance(sink, MqttSink) and sink.dropped == 0

            monkeypatch.setenv("EDGERT_MQTT_PASSWORD", "wrong")
            refused = open_sink(f"mqtts://127.0.0.1:{tls}/{TOPIC}?ca={tmp_path}/ca.pem&close_timeout=2")
            refused.open(INFO)
            refused.write(_result(99))
            refused.close()  # never accepted: the message is counted as lost, not silently gone
            assert refused.dropped == 1 and 99 not in sub.frames()
        finally:
            sub.stop()
    finally:
        broker.stop()
