"""A threading HTTP server that cannot be held open: idle clients time out, connections are capped.

The standard ``ThreadingHTTPServer`` starts one thread per connection and waits on each client forever,
so 500 clients that connect and say nothing hold 500 threads (and a slow MJPEG viewer holds one more
per stream) until the process dies. :class:`BoundedHTTPServer` gives every connection a socket timeout
(an idle or stalled client is dropped after ``idle_timeout_s``) and answers connections beyond
``max_clients`` with an immediate ``503`` from the accepting thread, without starting a thread for them.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DEFAULT_IDLE_TIMEOUT_S", "BoundedHTTPServer"]

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 10.0
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 17\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n\r\ntoo many clients\n")


class BoundedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with a per-connection timeout and at most ``max_clients`` handler threads."""

    daemon_threads = True
    request_queue_size = 128  # the default 5 loses connections under a burst before they are even counted

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_clients: int, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S) -> None:
        self.max_clients = max_clients
        self.idle_timeout_s = idle_timeout_s
        self.refused = 0  # connections answered 503 because max_clients were busy
        self._slots = threading.BoundedSemaphore(max_clients)
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        request, address = super().get_request()
        # The handler's reads and writes time out: a client that sends nothing, or stops reading a
        # stream, releases its thread after idle_timeout_s (BaseHTTPRequestHandler closes on timeout).
        request.settimeout(self.idle_timeout_s)
        return request, address

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            log.debug("refused %s: %d clients already", client_address, self.max_clients)
            try:
                request.settimeout(0.2)  # from the accepting thread: never wait on this client
                request.sendall(_BUSY)
            except OSError:  # the client went away or is too slow: it is refused either way
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanished mid-reply (reset, broken pipe) is the client's business: no traceback on
        # stderr (socketserver prints one by default), a debug line.
        log.debug("client %s: connection ended with an error", client_address, exc_info=True)
