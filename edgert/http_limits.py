"""A threading HTTP server that cannot be held open: idle clients time out, connections are capped.

The standard ``ThreadingHTTPServer`` starts one thread per connection and waits on each client forever,
so 500 clients that connect and say nothing hold 500 threads (and a slow MJPEG viewer holds one more
per stream) until the process dies. :class:`BoundedHTTPServer` gives every connection a socket timeout
(an idle or stalled client is dropped after ``idle_timeout_s``) and answers connections beyond
``max_clients`` with an immediate ``503`` from the accepting thread, without starting a thread for them.

The socket timeout is per ``recv``, so a client that trickles a header line every few seconds would never
time out and could hold every slot (slowloris). Each request therefore also has a whole-request deadline:
its request line and headers must arrive within ``header_timeout_s`` in total, or the connection is cut. A
client that reconnects as fast as it is cut would still hold every slot: one client address gets at most
``max_per_client`` of them (the metrics endpoint and the web preview give half), so the others keep being
served.

DNS rebinding: a web page the operator opens can make the browser send requests to a name that resolves to
the device (or to 127.0.0.1) and read the answers (camera frames, metrics). Those requests carry the page's
own name in ``Host``: a request whose ``Host`` is not an IP literal, ``localhost``, this machine's name or a
name listed in ``EDGERT_HTTP_HOSTS`` (comma-separated: the names the device is reached by) gets ``421``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "DEFAULT_IDLE_TIMEOUT_S", "ENV_HOSTS", "BoundedHTTPServer", "host_allowed"]

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 10.0
DEFAULT_HEADER_TIMEOUT_S = 4.0  # a real client sends its request and headers in one packet
ENV_HOSTS = "EDGERT_HTTP_HOSTS"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 17\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n\r\ntoo many clients\n")


class BoundedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with a per-connection timeout and at most ``max_clients`` handler threads."""

    daemon_threads = True
    request_queue_size = 128  # the default 5 loses connections under a burst before they are even counted

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_clients: int, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, max_per_client: int | None = None) -> None:
        self.max_clients = max_clients
        self.max_per_client = max_per_client or max_clients
        self._per_client: dict[str, int] = {}  # client address -> its connections now served
        self._count_lock = threading.Lock()
        self.idle_timeout_s = idle_timeout_s
        self.header_timeout_s = header_timeout_s
        self.cut = 0  # connections cut because their request did not arrive whole in time
        handler = _with_deadline(handler)
        self.refused = 0  # connections answered 503 because max_clients were busy
        self._slots = threading.BoundedSemaphore(max_clients)
        super().__init__(address, handler)
        self.reaper = _Reaper(self)  # after the bind: a port in use leaves no thread behind

    def get_request(self) -> tuple[Any, Any]:
        request, address = super().get_request()
        # The handler's reads and writes time out: a client that sends nothing, or stops reading a
        # stream, releases its thread after idle_timeout_s (BaseHTTPRequestHandler closes on timeout).
        request.settimeout(self.idle_timeout_s)
        return request, address

    def _refuse(self, request: Any, client_address: Any, why: str) -> None:
        self.refused += 1
        log.debug("refused %s: %s", client_address, why)
        with contextlib.suppress(OSError):  # the client went away or is too slow: it is refused either way
            request.settimeout(0.2)  # from the accepting thread: never wait on this client
            request.sendall(_BUSY)
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        who = str(client_address[0]) if isinstance(client_address, tuple) and client_address else "?"
        with self._count_lock:
            mine = self._per_client.get(who, 0)
            if mine >= self.max_per_client:
                self._refuse(request, client_address, f"{mine} connections from {who} already")
                return
            self._per_client[who] = mine + 1
        if not self._slots.acquire(blocking=False):
            self._leave(who)
            self._refuse(request, client_address, f"{self.max_clients} clients already")
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._leave(who)
            raise

    def _leave(self, who: str) -> None:
        with self._count_lock:
            left = self._per_client.get(who, 1) - 1
            if left > 0:
                self._per_client[who] = left
            else:
                self._per_client.pop(who, None)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._slots.release()
            self._leave(str(client_address[0]) if isinstance(client_address, tuple) and client_address else "?")

    def server_close(self) -> None:
        reaper = getattr(self, "reaper", None)  # absent when the bind itself failed
        if reaper is not None:
            reaper.close()
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanished mid-reply (reset, broken pipe) is the client's business: no traceback on
        # stderr (socketserver prints one by default), a debug line.
        log.debug("client %s: connection ended with an error", client_address, exc_info=True)



class _Reaper:
    """One thread per server that cuts connections whose request is overdue (one timer per request would be
    one more thread per client: what the cap is there to bound)."""

    def __init__(self, server: BoundedHTTPServer) -> None:
        self.server = server
        self._due: dict[Any, float] = {}  # handler -> monotonic deadline of its request
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edgert-http-reaper", daemon=True)
        self._thread.start()

    def watch(self, handler: Any) -> None:
        with self._lock:
            self._due[handler] = time.monotonic() + self.server.header_timeout_s

    def release(self, handler: Any) -> None:
        with self._lock:
            self._due.pop(handler, None)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._lock:
                overdue = [h for h, due in self._due.items() if due <= now]
                for handler in overdue:
                    del self._due[handler]
            for handler in overdue:
                self.server.cut += 1
                log.debug("cut %s: no whole request within %.0f s", handler.client_address,
                          self.server.header_timeout_s)
                try:
                    handler.connection.shutdown(socket.SHUT_RDWR)
                except OSError:  # already gone
                    pass

    def close(self) -> None:
        self._stop.set()


def _with_deadline(handler: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    """``handler`` whose every request must be read whole (request line and headers) within the server's
    ``header_timeout_s``; the server's reaper cuts the connection otherwise, however slowly it trickles."""

    class Deadline(handler):  # type: ignore[valid-type,misc]
        def handle_one_request(self) -> None:
            reaper: _Reaper = self.server.reaper  # type: ignore[attr-defined]
            reaper.watch(self)
            try:
                super().handle_one_request()
            finally:
                reaper.release(self)

        def parse_request(self) -> bool:
            ok = bool(super().parse_request())  # the headers are read: the rest is the handler's business
            self.server.reaper.release(self)  # type: ignore[attr-defined]
            if ok and not host_allowed(self.headers.get("Host")):
                self.send_error(421, "Misdirected Request", f"this server is not reached by that name; list it "
                                                            f"in {ENV_HOSTS} if it is the device's")
                return False
            return ok

    Deadline.__name__ = Deadline.__qualname__ = handler.__name__
    return Deadline


def host_allowed(header: str | None) -> bool:
    """Whether a request's ``Host`` names this server the way its users do (see the module): an IP literal,
    ``localhost``, this machine's name, or a name in ``EDGERT_HTTP_HOSTS``. No header (HTTP/1.0): allowed."""
    if header is None:
        return True
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    host = host.rstrip(".")
    with contextlib.suppress(ValueError):  # not an address: a name, checked below
        ipaddress.ip_address(host)
        return True
    names = {"localhost", socket.gethostname().lower(), socket.gethostname().lower() + ".local"}
    names.update(n.strip().lower().rstrip(".") for n in os.environ.get(ENV_HOSTS, "").split(",") if n.strip())
    return host in names or host.endswith(".localhost")
