"""Commands from a fleet over MQTT: one subscribed topic in, one status topic out, on one broker connection.

Built on the MQTT sink's client (:class:`~edgert.io.sinks.mqtt.MqttSink`: its reconnects, its bounded queue,
credentials from ``EDGERT_MQTT_USERNAME`` / ``EDGERT_MQTT_PASSWORD`` only, TLS with ``mqtts://``): the sink's
topic is where status messages go, and :class:`MqttCommands` subscribes to the command topic beside it (again
after every reconnect) and hands each message's payload to a callback on paho's network thread. The broker
authenticates who may publish commands; what a command may do is the caller's to check.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from edgert.io.sinks.base import StreamInfo
from edgert.io.sinks.mqtt import MqttSink

__all__ = ["MqttCommands"]

log = logging.getLogger(__name__)


class MqttCommands(MqttSink):
    """Status messages to ``status_topic`` (the URI's topic), commands from ``command_topic`` to ``on_command``."""

    def __init__(self, uri: str, host: str, port: int, topic: str, **kwargs: Any) -> None:
        super().__init__(uri, host, port, topic, **kwargs)
        self.command_topic = ""
        self.on_command: Callable[[bytes], None] | None = None

    @classmethod
    def open_topics(cls, uri: str, status_topic: str, command_topic: str,
                    on_command: Callable[[bytes], None]) -> MqttCommands:
        """Connect to the broker of ``uri`` (``mqtt://HOST[:PORT]/ANY``: only its host, port and options count)."""
        base = MqttSink.from_uri(uri)
        self = cls(uri, base.host, base.port, status_topic, tls=base.tls, qos=1, client_id=f"{base.client_id}-cmd",
                   keepalive=base.keepalive, close_timeout=2.0, ca_certs=base.ca_certs)
        self.command_topic = command_topic
        self.on_command = on_command
        self.open(StreamInfo(0, 0, 0.0, ()))
        return self

    def open(self, info: StreamInfo) -> None:
        super().open(info)
        self._client.on_message = self._on_message

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, *rest: Any) -> None:
        super()._on_connect(client, userdata, flags, rc, *rest)
        if getattr(rc, "value", rc) == 0 and self.command_topic:
            client.subscribe(self.command_topic, qos=1)  # again after every reconnect: clean sessions

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        if self.on_command is None:
            return
        try:
            self.on_command(bytes(message.payload))
        except Exception as exc:  # a bad command must not stop paho's thread
            log.error("mqtt: command on %s failed: %s", self.command_topic, exc)

    def status(self, record: dict[str, Any]) -> None:
        """One status message (JSON) to the status topic."""
        self.publish(json.dumps(record, separators=(",", ":")).encode())
