"""The web preview and the metrics endpoint under slow and silent clients, with real sockets."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from edgert.http_limits import BoundedHTTPServer
from edgert.service import metrics
from edgert.service.metrics import MetricsServer

SLOW_CLIENTS = 500


def _silent_clients(port: int, count: int) -> list[socket.socket]:
    """Clients that connect and then send nothing (half send a request line they never finish)."""
    clients = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
        clients.append(s)
    return clients


def _answer(s: socket.socket, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    try:
        return s.recv(200)
    except OSError:
        return b""


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _held_threads(baseline: int, settle: float = 1.0) -> int:
    time.sleep(settle)
    return threading.active_count() - baseline


@pytest.fixture()
def metrics_server() -> Iterator[MetricsServer]:
    server = MetricsServer("127.0.0.1", 0, lambda: "edgert_up 1\n")
    yield server
    server.close()


def test_metrics_500_silent_clients_hold_at_most_the_cap(metrics_server: MetricsServer) -> None:
    baseline = threading.active_count()
    clients = _silent_clients(metrics_server.port, SLOW_CLIENTS)
    try:
        held = _held_threads(baseline)
        assert held <= metrics.MAX_CLIENTS, held
        refused = sum(_answer(c, 0.5).startswith(b"HTTP/1.1 503") for c in clients[-50:])
        assert refused == 50  # beyond the cap: an immediate answer, no thread
    finally:
        for c in clients:
            c.close()
    deadline = time.monotonic() + 10
    while _get(metrics_server.url) != 200:  # the silent ones gone, the endpoint answers again
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_web_preview_500_silent_clients_hold_at_most_the_cap() -> None:
    pytest.importorskip("cv2")
    from edgert.io.sinks import StreamInfo
    from edgert.io.sinks.web import server as web

    sink = web.WebPreviewSink("http://127.0.0.1:0", port=0)
    sink.prepare()
    sink.open(StreamInfo(64, 48, 10.0))
    baseline = threading.active_count()
    try:
        clients = _silent_clients(sink.port, SLOW_CLIENTS)
        try:
            held = _held_threads(baseline)
            assert held <= web.MAX_CLIENTS, held
            assert _answer(clients[-1], 0.5).startswith(b"HTTP/1.1 503")
        finally:
            for c in clients:
                c.close()
        deadline = time.monotonic() + 10
        while _get(f"{sink.url}stats.json") != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        sink.close()


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"hi\n")

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep the test output free of access-log lines


def test_idle_client_is_dropped_after_the_timeout() -> None:
    server = BoundedHTTPServer(("127.0.0.1", 0), _Hello, max_clients=2, idle_timeout_s=0.5)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port)) as third:
            assert _answer(third).startswith(b"HTTP/1.1 503")
        t0 = time.monotonic()
        assert _answer(idle[0], 5.0) == b""  # closed by the server, with no answer
        assert time.monotonic() - t0 < 2.0
        time.sleep(0.2)
        assert _get(f"http://127.0.0.1:{port}/") == 200
        assert server.refused == 1
        for c in idle:
            c.close()
    finally:
        server.shutdown()
        server.server_close()
