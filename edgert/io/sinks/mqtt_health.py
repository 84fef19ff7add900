"""An MQTT connection that does not complete is said at once and again, and is seen in ``/metrics``.

paho-mqtt retries a failed connection in its own thread and says nothing: a wrong or missing CA, a TLS port
reached in plain (or the reverse), a broker that never sends CONNACK meant 100 % of the messages lost, reported
only at exit (never, for a service), rc 0. :class:`ConnectionWatch` runs beside the client: when no connection
has completed ``connect_timeout`` seconds after the start (or after a loss), it warns at once with what a probe
of its own finds (the TLS handshake's error, or "no CONNACK"), then again at most every :data:`REPEAT_S` while it
lasts. :func:`sink_figures` gives every open MQTT sink's gauges to the metrics exporter (connected, queued,
lost).

Client ids: one per process and sink, the same at every start of a service (:func:`claim_client_id`). Two
processes publishing to one URI with one id took over each other's session and disconnected each other in turn;
the second now takes ``ID-2`` (a lock file per id in the runtime folder says which are held by live processes).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
import weakref
from typing import Any

from edgert.redact import redact

__all__ = ["REPEAT_S", "ConnectionWatch", "claim_client_id", "release_client_id", "sink_figures"]

log = logging.getLogger("edgert.io.sinks.mqtt")

REPEAT_S = 60.0  # a failure that lasts is said again at most this often
_PROBE_S = 3.0
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()  # MQTT sinks now open, for the metrics exporter
_held: dict[str, int] = {}  # client ids this process holds, and the lock file's descriptor


def sink_figures() -> list[dict[str, Any]]:
    """``{"sink", "connected", "queued", "lost"}`` of every open MQTT sink of this process."""
    out = []
    for sink in list(_OPEN):
        out.append({"sink": redact(sink.uri), "connected": int(bool(sink.connected)), "queued": sink.pending,
                    "lost": int(sink.dropped)})
    return out


def _lock_folder() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR") or os.environ.get("RUNTIME_DIRECTORY")
    folder = os.path.join(runtime if runtime and os.path.isdir(runtime) else tempfile.gettempdir(), "edgert-mqtt-ids")
    os.makedirs(folder, mode=0o1777, exist_ok=True)
    return folder


def claim_client_id(base: str, most: int = 64) -> str:
    """``base``, or ``base-2``, ``base-3``... the first not held by another sink or live process on this machine
    (held until :func:`release_client_id` or the process's end). A restarted service gets its own back once the old
    process is gone."""
    try:
        folder = _lock_folder()
    except OSError:
        return base  # no folder to coordinate through: the id as it was
    for n in range(1, most + 1):
        name = base if n == 1 else f"{base}-{n}"
        if name in _held:
            continue
        try:
            fd = os.open(os.path.join(folder, name.replace("/", "_") + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                         0o666)
        except OSError:
            return name
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _held[name] = fd
        return name
    return f"{base}-{os.getpid()}"


def release_client_id(name: str) -> None:
    """Let another sink or process take ``name`` (a sink that closed)."""
    fd = _held.pop(name, None)
    if fd is not None:
        os.close(fd)  # releases the lock


def _probe(host: str, port: int, tls: bool, ca: str | None) -> str:
    """Why a connection may not complete, in a few words, from a connection of our own."""
    try:
        sock = socket.create_connection((host, port), timeout=_PROBE_S)
    except OSError as exc:
        return f"cannot connect: {exc.strerror or exc}"
    with contextlib.closing(sock):
        if tls:
            context = ssl.create_default_context(cafile=ca)
            try:
                with context.wrap_socket(sock, server_hostname=host) as wrapped:
                    wrapped.settimeout(_PROBE_S)
                    wrapped.do_handshake()
            except ssl.SSLError as exc:
                return f"TLS handshake failed: {exc.reason or exc}"
            except OSError as exc:
                return f"TLS handshake failed: {exc.strerror or exc or 'no answer'}"
            return "TLS is fine; the broker sends no CONNACK (refused, or not an MQTT broker)"
        return "TCP connects but no CONNACK came (a TLS port reached in plain: use mqtts://; or not an MQTT broker)"


class ConnectionWatch:
    """Warns while ``sink``'s connection does not complete (see the module); ``close`` ends it."""

    def __init__(self, sink: Any, connect_timeout: float) -> None:
        self.sink = sink
        self.connect_timeout = connect_timeout
        self.failures = 0  # connection attempts that failed (paho's on_connect_fail)
        self._down_since = time.monotonic()
        self._warned_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgert-mqtt-watch", daemon=True)
        _OPEN.add(sink)
        self._thread.start()

    def connected(self) -> None:
        if self._warned_at is not None:
            log.warning("mqtt: connected to %s:%d after %.0f s", self.sink.host, self.sink.port,
                        time.monotonic() - self._down_since)
        self._warned_at = None

    def lost(self) -> None:
        self._down_since = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            sink = self.sink
            if sink.connected:
                continue
            now = time.monotonic()
            down = now - self._down_since
            if down < self.connect_timeout or (self._warned_at is not None and now - self._warned_at < REPEAT_S):
                continue
            self._warned_at = now
            why = _probe(sink.host, sink.port, sink.tls, sink.ca_certs)
            log.warning("mqtt: no connection to %s:%d for %.0f s (%s); %d messages queued, %d lost so far. Note: "
                        "check the port (plain 1883, TLS 8883), ca= and the broker's log", sink.host, sink.port,
                        down, why, sink.pending, sink.dropped)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=_PROBE_S * 2 + 1)
        _OPEN.discard(self.sink)
