"""Issue 25, case 8, and #23's false warning: MQTT sinks against a real mosquitto on loopback, the real CLI."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import Cli, closed_port
from tests.helpers import assert_one_line_error, run_cli
from tests.io.test_sink_mqtt import MOSQUITTO, Broker, _free_port

mqtt = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is not installed (pip install 'edgert[mqtt]')")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    folder = tmp_path / "broker"
    folder.mkdir()
    b = Broker(folder, _free_port())
    b.start()
    yield b
    b.stop()


class Listener:
    """Subscribes to ``edgert/#`` and keeps every (topic, payload)."""

    def __init__(self, port: int) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        ready = threading.Event()
        if hasattr(mqtt, "CallbackAPIVersion"):
            self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="edgert-faults-listener")
        else:
            self.client = mqtt.Client(client_id="edgert-faults-listener")
        self.client.on_connect = lambda c, *rest: c.subscribe("edgert/#", qos=1)
        self.client.on_subscribe = lambda *args: ready.set()
        self.client.on_message = self._message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert ready.wait(10), "the listener did not subscribe"

    def _message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._lock:
            self.got.append((message.topic, json.loads(message.payload)))

    def frames(self, topic: str) -> set[int]:
        with self._lock:
            return {p["frame"] for t, p in self.got if t == topic and "frame" in p}

    def wait(self, topic: str, count: int, timeout: float = 20.0) -> set[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.frames(topic)) < count:
            time.sleep(0.05)
        return self.frames(topic)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_a_clean_stop_is_not_a_lost_broker(broker: Broker, media: dict[str, Path]) -> None:
    listener = Listener(broker.port)
    try:
        proc = run_cli("-v", "run", "--model", str(media["model"]), "--source", str(media["video"]),
                       "--sink", f"mqtt://127.0.0.1:{broker.port}/edgert/cam")
        assert proc.returncode == 0, proc.stderr
        assert listener.wait("edgert/cam", 40) == set(range(40))
    finally:
        listener.stop()
    assert "connected to 127.0.0.1" in proc.stderr
    assert "lost" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr


def test_per_source_sinks_do_not_take_over_each_others_session(tmp_path: Path, broker: Broker,
                                                               media: dict[str, Path]) -> None:
    names = ("a", "b", "c", "d")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\nsources:\n"
                   + "".join(f"  - {{uri: '{media['video']}', name: {n}}}\n" for n in names)
                   + f"sinks: ['mqtt://127.0.0.1:{broker.port}/edgert/{{source}}']\n", encoding="utf-8")
    listener = Listener(broker.port)
    try:
        proc = run_cli("-v", "run", "--config", str(cfg))
        assert proc.returncode == 0, proc.stderr
        for n in names:
            assert listener.wait(f"edgert/{n}", 40) == set(range(40)), n
    finally:
        listener.stop()
    assert "lost" not in proc.stderr and proc.stderr.count("mqtt: connected") == len(names), proc.stderr


def test_an_unreachable_broker_is_said_at_once_and_counted(media: dict[str, Path]) -> None:
    uri = f"mqtt://127.0.0.1:{closed_port()}/edgert/t?close_timeout=0&queue=10"
    run = Cli("run", "--model", str(media["model"]), "--source", str(media["long"]), "--loop", "--sink", uri,
              "--json")
    try:
        run.wait_for("is unreachable")
        assert run.proc.poll() is None  # said while the run goes on, not at its end
        run.wait_for("dropping messages")  # the queue of 10 filled: drops are counted as they happen
        run.signal()
        code, out = run.finish(30)
    finally:
        run.kill()
    assert code == 0, run.stderr
    summary = json.loads(out)
    assert summary["drops"].get(f"sink:{uri}", 0) > 0, summary["drops"]


@pytest.mark.parametrize(("topic", "needle"), [("edgert%00cam", "NUL"), ("edgert/+", "wildcard"),
                                              ("e" * 70000, "longer than 65535 bytes")])
def test_bad_topics_are_refused_at_start(tmp_path: Path, media: dict[str, Path], topic: str, needle: str) -> None:
    out = tmp_path / "e.jsonl"
    out.write_text("old\n")
    proc = run_cli("run", "--model", str(media["model"]), "--source", str(media["video"]),
                   "--sink", f"jsonl://{out}", "--sink", f"mqtt://127.0.0.1:1883/{topic}")
    assert_one_line_error(proc, needle)
    assert out.read_text() == "old\n"
