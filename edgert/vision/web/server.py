"""The web preview sink: a stdlib HTTP server with the annotated MJPEG stream and live statistics.

Routes: ``/`` the page (``index.html`` beside this module), ``/stream.mjpg`` the annotated frames as
``multipart/x-mixed-replace`` JPEGs, ``/stats.json`` the pipeline statistics (FPS, latency
percentiles, drops, watts when a power meter runs), ``/snapshot.jpg`` the latest frame.

It binds to 127.0.0.1 unless the URI names another host: a camera feed should not reach the network
by accident. Frames are JPEG-encoded on the sink's own thread, and only while someone is watching.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
from typing import Any
from urllib.parse import urlsplit

from edgert._lazy import lazy_import
from edgert._package_data import read_bytes
from edgert.errors import SinkError
from edgert.http_limits import BoundedHTTPServer
from edgert.stats import PipelineStats
from edgert.vision.sinks.base import FrameResult, Sink, StreamInfo

__all__ = ["WebPreviewSink"]

log = logging.getLogger(__name__)

BOUNDARY = b"edgertframe"
JPEG_QUALITY = 80


def _page() -> bytes:
    return read_bytes("edgert.vision.web", "index.html")


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "edgert-preview"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        sink = self.server.sink
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", sink.page)
        elif path == "/stats.json":
            self._send(200, "application/json", json.dumps(sink.stats_payload()).encode())
        elif path == "/snapshot.jpg":
            jpeg = sink.latest_jpeg()
            if jpeg is None:
                self._send(503, "text/plain", b"no frame yet\n")
            else:
                self._send(200, "image/jpeg", jpeg)
        elif path == "/stream.mjpg":
            self._stream(sink)
        else:
            self._send(404, "text/plain", b"not found\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, sink: WebPreviewSink) -> None:
        self.send_response(200)
        self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY.decode()}")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        sink.client_joined()
        try:
            seq = -1
            while not sink.closing:
                jpeg, seq_now = sink.wait_jpeg(seq, timeout=0.5)
                if jpeg is None:
                    continue
                seq = seq_now
                self.wfile.write(b"--" + BOUNDARY + b"\r\nContent-Type: image/jpeg\r\n")
                self.wfile.write(b"Content-Length: %d\r\n\r\n" % len(jpeg))
                self.wfile.write(jpeg + b"\r\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the viewer went away
        finally:
            sink.client_left()


#: Viewers at once (each stream holds a thread); more get a 503. A viewer that stops reading is dropped
#: after the idle timeout, so slow or silent clients cannot pile up threads.
MAX_CLIENTS = 32


class _Server(BoundedHTTPServer):
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], sink: WebPreviewSink) -> None:
        self.sink = sink
        super().__init__(address, _Handler, max_clients=MAX_CLIENTS)


class WebPreviewSink(Sink):
    """``http://127.0.0.1:8080``: serve the annotated stream and stats while the pipeline runs."""

    needs_image = True

    def __init__(self, uri: str, host: str = "127.0.0.1", port: int = 8080, title: str = "edgert") -> None:
        super().__init__(uri)
        self.host = host
        self.port = port
        self.title = title
        self.page = _page()
        self.closing = False
        self.running = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._jpeg: bytes | None = None
        self._seq = 0
        self._clients = 0
        self._stats: PipelineStats | None = None
        self._last_detections = 0
        self._info: StreamInfo | None = None

    @classmethod
    def from_uri(cls, uri: str, title: str = "edgert") -> WebPreviewSink:
        parts = urlsplit(uri)
        if parts.scheme != "http":
            raise SinkError(f"{uri}: the web preview serves plain http://HOST:PORT")
        try:
            port = parts.port if parts.port is not None else 8080
        except ValueError:
            raise SinkError(f"{uri}: invalid port") from None
        return cls(uri, parts.hostname or "127.0.0.1", port, title)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/"

    # -- sink ---------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Bind the port now (before any other sink truncates its file); ``url`` is real from here on."""
        if self._server is not None:
            return
        lazy_import("cv2", "the web preview (JPEG encoding)")
        try:
            self._server = _Server((self.host, self.port), self)
        except OSError as exc:
            raise SinkError(f"{self.uri}: cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self.port = int(self._server.server_address[1])

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        assert self._server is not None
        self._info = info
        self._stats = info.stats
        self.title = info.title or self.title
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("web preview listens on %s:%d: reachable from the network", self.host, self.port)
        self.running = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="edgert-web-preview", daemon=True)
        self._thread.start()
        log.info("web preview at %s", self.url)

    def write(self, result: FrameResult) -> None:
        self._last_detections = len(result.detections)
        if result.image is None or (self._clients == 0 and self._jpeg is not None):
            return  # nobody watching: skip the JPEG work (the snapshot keeps the last one encoded)
        cv2 = lazy_import("cv2")
        ok, buf = cv2.imencode(".jpg", result.image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            return
        with self._cond:
            self._jpeg = buf.tobytes()
            self._seq += 1
            self._cond.notify_all()

    def close(self) -> None:
        self.running = False
        self.closing = True
        with self._cond:
            self._cond.notify_all()
        if self._server is not None:
            if self._thread is not None:  # serving: stop the loop (shutdown() waits for one that never ran)
                self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    # -- for the request handlers -------------------------------------------------------------------
    def client_joined(self) -> None:
        with self._cond:
            self._clients += 1

    def client_left(self) -> None:
        with self._cond:
            self._clients -= 1

    def wait_jpeg(self, after: int, timeout: float) -> tuple[bytes | None, int]:
        """The newest JPEG once it is newer than ``after`` (or None after ``timeout``)."""
        with self._cond:
            if self._seq <= after or self._jpeg is None:
                self._cond.wait(timeout)
            if self._seq <= after or self._jpeg is None:
                return None, after
            return self._jpeg, self._seq

    def latest_jpeg(self) -> bytes | None:
        with self._cond:
            return self._jpeg

    def stats_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"title": self.title, "running": self.running, "viewers": self._clients,
                                   "last_detections": self._last_detections}
        if self._info is not None:
            payload["source"] = {"width": self._info.width, "height": self._info.height, "fps": self._info.fps}
        if self._stats is not None:
            payload.update(self._stats.snapshot())
        return payload
