"""The web preview sink: a stdlib HTTP server with the annotated MJPEG stream and live statistics.

Routes: ``/`` the page (``index.html`` beside this module), ``/stream.mjpg`` the annotated frames as
``multipart/x-mixed-replace`` JPEGs, ``/snapshot.jpg`` the latest frame, ``/stats.json`` the pipeline
statistics (FPS, latency percentiles, drops, watts when a power meter runs), ``/sources.json`` the sources
with their own figures (frames, FPS, drops, reconnects from ``stats.sources``, frame size).

One preview takes the frames of every source of a run (``multi_source``): it keeps the latest JPEG of each,
``?source=NAME`` picks one on the stream and the snapshot (without it: the first source, so a run with one
source reads as before), and a name the run does not have is a 404. The page shows one tile per source.

It binds to 127.0.0.1 unless the URI names another host: a camera feed should not reach the network
by accident. Frames are JPEG-encoded on the sink's own thread, and only for a source someone is watching
(a stream open, or a snapshot asked for).
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

from edgert._lazy import lazy_import
from edgert._package_data import read_bytes
from edgert.errors import SinkError
from edgert.http_limits import BoundedHTTPServer
from edgert.io.sinks.base import FrameResult, Sink, StreamInfo
from edgert.stats import PipelineStats

__all__ = ["WebPreviewSink"]

log = logging.getLogger(__name__)

BOUNDARY = b"edgertframe"
JPEG_QUALITY = 80
#: How long a snapshot of a source nobody streams waits for a freshly encoded frame before it takes the last one.
SNAPSHOT_WAIT_S = 1.0


def _page() -> bytes:
    return read_bytes("edgert.io.sinks.web", "index.html")


class _Channel:
    """One source's latest JPEG and who watches it. Read and written under the sink's condition."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.jpeg: bytes | None = None
        self.seq = 0  # JPEGs encoded so far
        self.clients = 0  # open streams
        self.wanted = 0  # snapshot requests waiting for a fresh JPEG
        self.frames = 0  # frames written (encoded or not)
        self.size: tuple[int, int] | None = None  # (width, height) of the last frame
        self.last_detections = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "edgert-preview"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        sink = self.server.sink
        path, _, query = self.path.partition("?")
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", sink.page)
        elif path == "/stats.json":
            self._send(200, "application/json", json.dumps(sink.stats_payload()).encode())
        elif path == "/sources.json":
            self._send(200, "application/json", json.dumps(sink.sources_payload()).encode())
        elif path in ("/snapshot.jpg", "/stream.mjpg"):
            names = parse_qs(query).get("source")
            channel = sink.channel(names[0] if names else None)
            if channel is None:
                self._send(404, "text/plain; charset=utf-8", sink.unknown_source(names[0] if names else None))
            elif path == "/stream.mjpg":
                self._stream(sink, channel)
            else:
                jpeg = sink.snapshot(channel)
                if jpeg is None:
                    self._send(503, "text/plain", b"no frame yet\n")
                else:
                    self._send(200, "image/jpeg", jpeg)
        else:
            self._send(404, "text/plain", b"not found\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, sink: WebPreviewSink, channel: _Channel) -> None:
        self.send_response(200)
        self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY.decode()}")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        sink.client_joined(channel)
        try:
            seq = -1
            while not sink.closing:
                jpeg, seq_now = sink.wait_jpeg(seq, timeout=0.5, channel=channel)
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
            sink.client_left(channel)


#: Viewers at once (each stream holds a thread; a page of tiles holds one per source); more get a 503. A viewer
#: that stops reading is dropped after the idle timeout, so slow or silent clients cannot pile up threads.
MAX_CLIENTS = 32


class _Server(BoundedHTTPServer):
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], sink: WebPreviewSink) -> None:
        self.sink = sink
        # one address holds at most half (a page of 16 tiles fits): other viewers still get in
        super().__init__(address, _Handler, max_clients=MAX_CLIENTS, max_per_client=MAX_CLIENTS // 2)


def count_totals(counts: Any) -> dict[str, dict[str, int]]:
    """``Analytics.counts()`` of one source summed over classes, for the page's side panel: a line's ``in`` and
    ``out``, a zone's ``occupancy`` and ``entered`` (what the video's drawing shows)."""
    out: dict[str, dict[str, int]] = {}
    for name, per_class in dict(counts or {}).items():
        totals: dict[str, int] = {}
        for figures in dict(per_class or {}).values():
            for key in ("in", "out", "occupancy", "entered"):
                if isinstance(figures, dict) and isinstance(figures.get(key), (int, float)):
                    totals[key] = totals.get(key, 0) + int(figures[key])
        out[str(name)] = totals
    return out


class WebPreviewSink(Sink):
    """``http://127.0.0.1:8080``: serve the annotated stream of each source and the stats while the pipeline runs."""

    needs_image = True
    skips_frames = True  # a tab nobody watches skips frames; the source lost none
    multi_source = True

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
        self._channels: dict[str, _Channel] = {}  # in the run's source order; the first is the default
        self._stats: PipelineStats | None = None
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
        if self.port == 0:  # the port the system chose is what the run announces and shows, not ":0"
            self.port = int(self._server.server_address[1])
            host = f"[{self.host}]" if ":" in self.host else self.host
            self.uri = f"http://{host}:{self.port}"
        self.port = int(self._server.server_address[1])

    def open(self, info: StreamInfo) -> None:
        self.prepare()
        assert self._server is not None
        self._info = info
        self._stats = info.stats
        self.title = info.title or self.title
        with self._cond:
            for name in info.sources:
                self._channels.setdefault(name, _Channel(name))
        # The pipeline hands frames over one queue; room for one frame per source, so a source that arrives
        # while another is being encoded waits instead of being dropped (the worker reads this after open).
        self.queue_size = max(type(self).queue_size, len(info.sources))
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("web preview listens on %s:%d: reachable from the network", self.host, self.port)
        self.running = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="edgert-web-preview", daemon=True)
        self._thread.start()
        log.info("web preview at %s", self.url)

    def write(self, result: FrameResult) -> None:
        with self._cond:
            channel = self._channel_for(result.source)
            channel.frames += 1
            channel.last_detections = len(result.detections)
            image = result.image
            if image is not None:
                channel.size = (int(image.shape[1]), int(image.shape[0]))
            # Nobody watching this source: skip the JPEG work (the snapshot keeps the last one encoded).
            if image is None or (channel.clients == 0 and channel.wanted == 0 and channel.jpeg is not None):
                return
        cv2 = lazy_import("cv2")
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            return
        with self._cond:
            channel.jpeg = buf.tobytes()
            channel.seq += 1
            self._cond.notify_all()

    def _channel_for(self, name: str | None) -> _Channel:
        """The channel of a frame's source (call with the condition held); a frame without a source name
        (the sink used on its own) goes to the first."""
        if name is None:
            if self._channels:
                return next(iter(self._channels.values()))
            name = "0"
        channel = self._channels.get(name)
        if channel is None:  # a source the sink was not told about at open: it gets a channel of its own
            channel = self._channels[name] = _Channel(name)
        return channel

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
    def channel(self, name: str | None) -> _Channel | None:
        """The channel of source ``name`` (None: the first one); None for a name this run does not have."""
        with self._cond:
            if name is None:
                return self._channel_for(None)
            return self._channels.get(name)

    def unknown_source(self, name: str | None) -> bytes:
        with self._cond:
            names = ", ".join(self._channels) or "none yet"
        shown = json.dumps(name)[:80]  # quoted and escaped: the name came from the request
        return f"no source named {shown}; sources: {names}\n".encode()

    def client_joined(self, channel: _Channel | None = None) -> None:
        with self._cond:
            (channel or self._channel_for(None)).clients += 1

    def client_left(self, channel: _Channel | None = None) -> None:
        with self._cond:
            (channel or self._channel_for(None)).clients -= 1

    def wait_jpeg(self, after: int, timeout: float, channel: _Channel | None = None) -> tuple[bytes | None, int]:
        """The newest JPEG of ``channel`` (default: the first source) once it is newer than ``after`` (or None
        after ``timeout``)."""
        with self._cond:
            ch = channel or self._channel_for(None)
            if ch.seq <= after or ch.jpeg is None:
                self._cond.wait(timeout)
            if ch.seq <= after or ch.jpeg is None:
                return None, after
            return ch.jpeg, ch.seq

    def snapshot(self, channel: _Channel) -> bytes | None:
        """The latest JPEG of ``channel``. When nobody streams that source its last JPEG may be old: ask the
        sink's thread to encode the next frame and wait for it a little (not after the run ended)."""
        with self._cond:
            if channel.clients == 0 and self.running and not self.closing:
                seen = channel.seq
                channel.wanted += 1
                try:
                    self._cond.wait_for(lambda: channel.seq > seen or self.closing, SNAPSHOT_WAIT_S)
                finally:
                    channel.wanted -= 1
            return channel.jpeg

    def sources_payload(self) -> dict[str, Any]:
        """Each source in order: its name, frame size, viewers, JPEGs encoded, and the pipeline's own
        per-source figures."""
        figures = self._stats.sources if self._stats is not None else {}
        with self._cond:
            rows: list[dict[str, Any]] = [
                {"name": ch.name, "width": ch.size[0] if ch.size else None,
                 "height": ch.size[1] if ch.size else None, "viewers": ch.clients,
                 "last_detections": ch.last_detections, "encoded": ch.seq}
                for ch in self._channels.values()]
        analytics = dict(getattr(self._stats, "analytics_by_source", None) or {})
        for row in rows:
            own = figures.get(str(row["name"]), {})
            row.update({"frames": int(own.get("frames", 0)), "fps": own.get("fps", 0.0),
                        "dropped": int(own.get("dropped", 0)), "reconnects": int(own.get("reconnects", 0)),
                        "counts": count_totals(analytics.get(str(row["name"])))})
        return {"title": self.title, "running": self.running, "sources": rows}

    def stats_payload(self) -> dict[str, Any]:
        with self._cond:
            viewers = sum(ch.clients for ch in self._channels.values())
            last = sum(ch.last_detections for ch in self._channels.values())
            count = len(self._channels)
            first = next(iter(self._channels.values()), None)
            seen = first.size if first is not None else None
        payload: dict[str, Any] = {"title": self.title, "running": self.running, "viewers": viewers,
                                   "last_detections": last, "source_count": count}
        if self._info is not None:
            # The size of the frames seen beats the one known at open: a camera that was not up at start is
            # opened with 0 x 0, which the page would show as a size; unknown is null until its first frame.
            width, height = seen if seen is not None else (self._info.width, self._info.height)
            payload["source"] = {"width": width or None, "height": height or None, "fps": self._info.fps}
        if self._stats is not None:
            payload.update(self._stats.snapshot())
        return payload
