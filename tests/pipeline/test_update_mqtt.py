"""The MQTT door of a model update against a real mosquitto on loopback: refused commands (wrong sha256, an
unknown file, a path outside the allowed folder, a URL) each get a status message saying why; a good one swaps
the model of the running pipeline, its states published on the status topic."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgert.atomic_file import sha256_file
from edgert.errors import ConfigError
from edgert.pipeline import Pipeline, PipelineStats
from edgert.pipeline.update_mqtt import check_command
from tests.io.test_sink_mqtt import MOSQUITTO, Broker, _free_port
from tests.pipeline.test_model_update import DropMidRun, _config, _records

mqtt = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is not installed (pip install 'edgert[mqtt]')")


def _cmd(**kw: Any) -> bytes:
    return json.dumps(kw).encode()


def test_commands_are_checked_against_the_allowed_folder(tmp_path: Path) -> None:
    folder = tmp_path / "allowed"
    folder.mkdir()
    model = folder / "m.onnx"
    model.write_bytes(b"model")
    (tmp_path / "secret.onnx").write_bytes(b"x")
    (folder / "link.onnx").symlink_to(tmp_path / "secret.onnx")
    good = sha256_file(model)
    assert check_command(_cmd(file="m.onnx", sha256=good, precision="int8"), folder) == (model.resolve(),
                                                                                        {"precision": "int8"})
    refused = {
        "sha256 differs": _cmd(file="m.onnx", sha256="0" * 64),
        "no such file": _cmd(file="gone.onnx", sha256=good),
        "outside the allowed folder": _cmd(file="../secret.onnx", sha256=good),
        "is a URL": _cmd(file="https://example.com/m.onnx", sha256=good),
        "unknown keys url": _cmd(file="m.onnx", sha256=good, url="https://example.com/m.onnx"),
        "not a JSON command": b"{",
        "reference": _cmd(file="m.onnx", sha256=good, reference="/etc/passwd"),
    }
    for why, payload in refused.items():
        with pytest.raises(ConfigError, match=why):
            check_command(payload, folder)
    with pytest.raises(ConfigError, match="outside the allowed folder"):
        check_command(_cmd(file=str(tmp_path / "secret.onnx"), sha256=good), folder)
    with pytest.raises(ConfigError, match="outside the allowed folder"):
        check_command(_cmd(file="link.onnx", sha256=good), folder)  # a link leading out


class Fleet:
    """The fleet's side: a paho client that publishes commands and collects the device's status messages."""

    def __init__(self, port: int, prefix: str) -> None:
        self.prefix = prefix
        self.statuses: list[dict[str, Any]] = []
        self._subscribed = threading.Event()
        if hasattr(mqtt, "CallbackAPIVersion"):
            self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="fleet")
        else:
            self.client = mqtt.Client(client_id="fleet")
        self.client.on_connect = lambda c, u, f, rc, *rest: c.subscribe(f"{prefix}/model/status", qos=1)
        self.client.on_subscribe = lambda *args: self._subscribed.set()
        self.client.on_message = lambda c, u, m: self.statuses.append(json.loads(m.payload))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self._subscribed.wait(10)

    def send(self, **command: Any) -> None:
        self.client.publish(f"{self.prefix}/model/update", json.dumps(command), qos=1).wait_for_publish(10)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class CommandsMidRun(DropMidRun):
    """At frame ``at``, the fleet sends three bad commands and a good one (instead of a dropped file)."""

    def __init__(self, fleet: Fleet, model: Path, folder: Path) -> None:
        super().__init__(model, folder)
        self.fleet = fleet

    def on_frames(self, stats: PipelineStats) -> None:
        if self.dropped or stats.frames < self.at:
            return
        self.dropped = True
        digest = sha256_file(self.model)
        self.fleet.send(file=self.model.name, sha256="0" * 64)
        self.fleet.send(file="missing.onnx", sha256=digest)
        self.fleet.send(file="../../etc/passwd", sha256=digest)
        deadline = time.monotonic() + 10  # the refusals first, so the test knows which is which
        while len(self.fleet.statuses) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.fleet.send(file=self.model.name, sha256=digest)


@pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto is not installed (apt-get install mosquitto)")
@pytest.mark.slow
def test_the_mqtt_door_refuses_bad_commands_and_swaps_on_a_good_one(assets: Path, tmp_path: Path) -> None:
    broker = Broker(tmp_path, _free_port())
    broker.start()
    fleet = Fleet(broker.port, "edgert/cam1")
    try:
        files = tmp_path / "files"
        files.mkdir()
        model = files / "yolov3-tiny-coco-416.onnx"
        shutil.copyfile(assets / "models/detection/yolov3-tiny-coco-416.onnx", model)
        config = _config(assets, tmp_path, update_mqtt=f"mqtt://127.0.0.1:{broker.port}/edgert/cam1",
                         update_files=str(files))
        events = tmp_path / "out.jsonl"
        door = CommandsMidRun(fleet, model, tmp_path / "updates")
        summary = Pipeline(config, sinks=[f"jsonl://{events}"], observers=[door], admit=door.admit,
                           handle_signals=False).run()
        deadline = time.monotonic() + 10
        while not any(s.get("state") == "swapped" for s in fleet.statuses) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        fleet.stop()
        broker.stop()
    frames, swaps = _records(events)
    assert [r["frame"] for r in frames] == list(range(260)) and len(swaps) == 1
    assert summary["model_update"]["state"] == "swapped"
    refused = [s["why"] for s in fleet.statuses if s["state"] == "refused"]
    assert len(refused) == 3
    assert "sha256 differs" in refused[0]
    assert "no such file" in refused[1]
    assert "outside the allowed folder" in refused[2]
    states = [s["state"] for s in fleet.statuses if s["state"] != "refused"]
    assert states[0] == "queued" and states[-1] == "swapped" and "checking" in states, states
    assert all(s.get("via", "mqtt") == "mqtt" for s in fleet.statuses if s["state"] == "queued")
    assert model.exists()  # the device's copy stays where the fleet put it
