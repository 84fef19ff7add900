"""MQTT sink: every frame result (and every analytics event) as a JSON message to a broker.

``mqtt://broker:1883/edgert/camera1`` (``mqtts://`` for TLS, port 8883 by default). Payloads are the
JSONL sink's records: one per frame (``{"frame", "timestamp", "detections"}``) and one per analytics event
(``{"type": "line_cross", ...}``), all on the one topic. Query options: ``qos=0|1|2`` (default 1),
``events=only`` (no frame records), ``queue=N`` (messages held while the broker is away, default 10000),
``client_id=ID``, ``keepalive=S``, ``close_timeout=S`` (default 10), ``ca=PATH`` (mqtts: a private CA),
``connect_timeout=S`` (default 10: a connection not complete by then is a warning, repeated while it lasts, and
``edgert_sink_connected 0`` in ``/metrics``: :mod:`edgert.io.sinks.mqtt_health`).

Credentials come from the environment only, ``EDGERT_MQTT_USERNAME`` and ``EDGERT_MQTT_PASSWORD`` (a
service reads them from its EnvironmentFile): a URI with ``user:password@`` is refused, since command lines
show in ``ps`` and in unit files.

Delivery: paho-mqtt's network thread connects in the background and reconnects with backoff (1 s doubling
to 30 s), so a broker that is down at start or goes away later costs nothing but a wait. With QoS 1 or 2
every message stays in paho's bounded queue until the broker acknowledges it, and unacknowledged ones are
sent again after a reconnect; when the queue is full the new message is dropped and counted in
``dropped`` (the pipeline reports it as ``sink:URI`` drops). QoS 0 is at most once: a message published
while disconnected is dropped and counted. ``close`` waits up to ``close_timeout`` for acknowledgements;
what is still unacknowledged then is counted as dropped too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from edgert._lazy import lazy_import
from edgert.errors import SinkError
from edgert.io.sinks.base import FrameResult, Sink, StreamInfo, event_records, result_records
from edgert.io.sinks.mqtt_health import ConnectionWatch, claim_client_id, release_client_id
from edgert.redact import redact, split_userinfo

__all__ = ["ENV_PASSWORD", "ENV_USERNAME", "MqttSink"]

log = logging.getLogger(__name__)

ENV_USERNAME = "EDGERT_MQTT_USERNAME"
ENV_PASSWORD = "EDGERT_MQTT_PASSWORD"
_OPTIONS = ("qos", "events", "queue", "client_id", "keepalive", "close_timeout", "ca", "connect_timeout")
_MAX_QUEUE = 60000  # paho's message ids are 16-bit: keep every pending id distinct
_MAX_TOPIC_BYTES = 65535  # MQTT's length prefix


def _stable_client_id(host: str, port: int, topic: str) -> str:
    digest = hashlib.sha1(f"{host}:{port}/{topic}".encode()).hexdigest()[:12]  # a name, not a secret
    return f"edgert-{socket.gethostname()}-{digest}"[:64]


def _number(uri: str, key: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise SinkError(f"{uri}: {key}={text!r}: expected a number from {low:g} to {high:g}")
    return value


class MqttSink(Sink):
    """Publishes JSON records to one topic of an MQTT broker (paho-mqtt, imported at open)."""

    queue_size = 1024  # publish() only queues: this sink keeps up unless the machine is starved

    def __init__(self, uri: str, host: str, port: int, topic: str, *, tls: bool = False, qos: int = 1,
                 events_only: bool = False, max_queued: int = 10000, client_id: str | None = None,
                 keepalive: int = 30, close_timeout: float = 10.0, ca_certs: str | None = None,
                 connect_timeout: float = 10.0) -> None:
        super().__init__(uri)
        self.host, self.port, self.topic, self.tls = host, port, topic, tls
        self.qos, self.events_only, self.max_queued = qos, events_only, max_queued
        # One id per sink instance, the same at every start: two sinks (one per source) never take over each
        # other's session at the broker, and a restarted service finds its own.
        self.client_id = client_id or _stable_client_id(host, port, topic)
        self._own_id = client_id is None  # ours to make unique per process at open (claim_client_id)
        self._base_id = self.client_id
        self.connect_timeout = connect_timeout
        self._watch: ConnectionWatch | None = None
        self.keepalive, self.close_timeout, self.ca_certs = keepalive, close_timeout, ca_certs
        self.published = 0  # messages the broker acknowledged (QoS 0: written to the socket)
        self.connects = 0
        self._client: Any = None
        self._mqtt: Any = None
        self._lock = threading.Condition()
        self._pending: set[int] = set()  # message ids published but not yet acknowledged
        self._early: set[int] = set()  # acknowledged before publish() returned its id
        self._connected = False
        self._closing = False  # our own disconnect() is not a loss
        self._abandoned = threading.Event()  # a second signal: stop waiting for acknowledgements
        self._warned_full = False

    # -- URI ----------------------------------------------------------------------------------------
    @classmethod
    def from_uri(cls, uri: str) -> MqttSink:
        scheme, _, rest = uri.partition("://")
        # User info is read as redaction reads it (up to the last '@'): a password holding '/', '?' or '#'
        # would otherwise pass for a host and a topic, and be published to and shown.
        userinfo, after = split_userinfo(rest)
        if userinfo:
            raise SinkError(f"{scheme}://{redact(after)}: credentials do not belong in the URI "
                            f"(command lines show in ps and unit files). Note: set {ENV_USERNAME} and "
                            f"{ENV_PASSWORD} in the environment (an at sign in a topic is written %40)")
        try:
            parts = urlsplit(uri.replace("#", "%23"))  # '#' is a topic wildcard here, not a URL fragment
        except ValueError as exc:  # an unbalanced '[' of an IPv6 host
            raise SinkError(f"{uri}: {exc}") from None
        tls = parts.scheme == "mqtts"
        host = parts.hostname
        if not host:
            raise SinkError(f"{uri}: expected {parts.scheme}://HOST[:PORT]/TOPIC")
        try:
            port = parts.port or (8883 if tls else 1883)
        except ValueError:
            raise SinkError(f"{uri}: the port is not a number from 1 to 65535") from None
        topic = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
        if not topic:
            raise SinkError(f"{uri}: no topic. Note: expected {parts.scheme}://{host}:{port}/TOPIC, e.g. /edgert/cam1")
        if "+" in topic or "#" in topic:
            raise SinkError(f"{uri}: topic {topic!r} has a wildcard (+ or #): those are for subscribing; "
                            "publish to a plain topic such as edgert/cam1")
        if "\0" in topic or len(topic.encode("utf-8", "surrogatepass")) > _MAX_TOPIC_BYTES:
            raise SinkError(f"{uri}: the topic has a NUL character or is longer than {_MAX_TOPIC_BYTES} bytes: "
                            "every publish would fail")
        options: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key not in _OPTIONS:
                raise SinkError(f"{uri}: unknown option {key!r}. Note: valid options are {', '.join(_OPTIONS)}")
            options[key] = value
        qos_text = options.get("qos", "1")
        if qos_text not in ("0", "1", "2"):
            raise SinkError(f"{uri}: qos={qos_text!r}: expected 0, 1 or 2")
        events = options.get("events", "all")
        if events not in ("all", "only"):
            raise SinkError(f"{uri}: events={events!r}: expected only (analytics events alone) or all")
        if "ca" in options and not tls:
            raise SinkError(f"{uri}: ca= is for TLS. Note: use mqtts://")
        return cls(
            uri, host, port, topic, tls=tls, qos=int(qos_text), events_only=events == "only",
            max_queued=int(_number(uri, "queue", options.get("queue", "10000"), 1, _MAX_QUEUE)),
            client_id=options.get("client_id") or None,
            keepalive=int(_number(uri, "keepalive", options.get("keepalive", "30"), 5, 3600)),
            close_timeout=_number(uri, "close_timeout", options.get("close_timeout", "10"), 0, 3600),
            ca_certs=options.get("ca") or None,
            connect_timeout=_number(uri, "connect_timeout", options.get("connect_timeout", "10"), 0.5, 3600),
        )

    # -- lifecycle ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Checked before any sink of the run truncates its output: paho is there, the host resolves."""
        lazy_import("paho.mqtt.client", "the MQTT sink")
        try:
            socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            # A name that does not resolve is a typo or a missing DNS entry: fail now. A broker that is
            # down is not an error: the client keeps trying in the background.
            raise SinkError(f"{self.uri}: cannot resolve the broker host {self.host!r}: {exc.strerror}") from None

    def open(self, info: StreamInfo) -> None:
        mqtt = lazy_import("paho.mqtt.client", "the MQTT sink")
        self.prepare()
        try:
            socket.create_connection((self.host, self.port), timeout=2.0).close()
        except OSError as exc:
            # Said at once, not at close: the run goes on, messages wait in the queue (counted as drops when
            # it is full, or at close when still unacknowledged) and the client keeps reconnecting.
            log.warning("mqtt: broker %s:%d is unreachable (%s); the run goes on, messages wait in the queue "
                        "(queue=%d) and what cannot be delivered is counted as dropped", self.host, self.port,
                        exc.strerror or exc, self.max_queued)
        if self._own_id:  # two processes publishing to one URI must not share an id (they would disconnect
            self.client_id = claim_client_id(self._base_id)  # each other in turn); a restart gets its own back
        if hasattr(mqtt, "CallbackAPIVersion"):  # paho-mqtt 2.x (Python 3.9+)
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, clean_session=True)
        else:  # paho-mqtt 1.6 (Python 3.8)
            client = mqtt.Client(client_id=self.client_id, clean_session=True)
        username = os.environ.get(ENV_USERNAME)
        if username:
            client.username_pw_set(username, os.environ.get(ENV_PASSWORD) or None)
        if self.tls:
            try:
                client.tls_set(ca_certs=self.ca_certs)
            except (OSError, ValueError) as exc:
                raise SinkError(f"{self.uri}: cannot set up TLS: {exc}") from None
        client.max_queued_messages_set(self.max_queued)
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        self._mqtt = mqtt
        self._client = client
        client.connect_async(self.host, self.port, keepalive=self.keepalive)
        self._watch = ConnectionWatch(self, self.connect_timeout)
        client.loop_start()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, *rest: Any) -> None:
        code = getattr(rc, "value", rc)
        if code == 0:
            with self._lock:
                self._connected = True
                self.connects += 1
            log.info("mqtt: connected to %s:%d", self.host, self.port)
            if self._watch is not None:
                self._watch.connected()
        else:
            log.error("mqtt: %s:%d refused the connection: %s", self.host, self.port, rc)

    def _on_disconnect(self, client: Any, userdata: Any, *args: Any) -> None:
        with self._lock:
            was = self._connected
            self._connected = False
        if was and not self._closing:
            log.warning("mqtt: lost %s:%d; reconnecting, messages wait in the queue", self.host, self.port)
            if self._watch is not None:
                self._watch.lost()

    def _on_publish(self, client: Any, userdata: Any, mid: int, *rest: Any) -> None:
        with self._lock:
            self.published += 1
            if mid in self._pending:
                self._pending.discard(mid)
                if not self._pending:
                    self._lock.notify_all()
            else:
                self._early.add(mid)

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def pending(self) -> int:
        """Messages published and not yet acknowledged (queued while away, or in flight)."""
        with self._lock:
            return len(self._pending)

    # -- writing ------------------------------------------------------------------------------------
    def write(self, result: FrameResult) -> None:
        records = event_records(result) if self.events_only else result_records(result)
        for record in records:
            self.publish(json.dumps(record, separators=(",", ":")).encode())

    def publish(self, payload: bytes) -> bool:
        """Queue one message; False (and counted in ``dropped``) when the queue is full or QoS 0 has no link."""
        client, mqtt = self._client, self._mqtt
        if client is None:
            self.dropped += 1
            return False
        info = client.publish(self.topic, payload, qos=self.qos)
        rc = getattr(info, "rc", 0)
        lost = rc == mqtt.MQTT_ERR_QUEUE_SIZE or (self.qos == 0 and rc != mqtt.MQTT_ERR_SUCCESS)
        if lost:
            self.dropped += 1
            if not self._warned_full:
                self._warned_full = True
                why = "the queue is full" if rc == mqtt.MQTT_ERR_QUEUE_SIZE else "QoS 0 and no connection"
                log.warning("mqtt: dropping messages to %s (%s, queue=%d); counted as drops",
                            self.uri, why, self.max_queued)
            return False
        with self._lock:
            if info.mid in self._early:
                self._early.discard(info.mid)
            else:
                self._pending.add(info.mid)
        return True

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until the broker has acknowledged everything; True when it has."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or self._abandoned.is_set():
                    return False
                self._lock.wait(min(left, 0.5))
        return True

    def abandon(self) -> None:
        """Stop waiting for acknowledgements (a second signal): :meth:`close` then counts what is unsent."""
        self._abandoned.set()
        with self._lock:
            self._lock.notify_all()

    def close(self) -> None:
        client = self._client
        if client is None:
            return
        if not self.flush(self.close_timeout):
            unsent = self.pending
            self.dropped += unsent
            log.warning("mqtt: %d messages to %s were not acknowledged within %.0f s and are lost",
                        unsent, self.uri, self.close_timeout)
        self._closing = True
        client.disconnect()
        client.loop_stop()
        self._client = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._own_id:
            release_client_id(self.client_id)
        log.info("mqtt: %d messages acknowledged by %s:%d, %d dropped", self.published, self.host, self.port,
                 self.dropped)
