"""An optional Prometheus endpoint: ``edgert run --metrics 127.0.0.1:9400`` serves ``/metrics``.

Plain standard library: an ``http.server`` thread writing the text exposition format (version 0.0.4),
so the runtime needs no extra package. :class:`MetricsObserver` is a pipeline observer that only keeps a
reference to the pipeline's live statistics; every number is read when Prometheus scrapes, so a frame
costs nothing. The latency quantiles are those of the last frames the pipeline keeps (a window, not
since start), hence gauges with a ``quantile`` label.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

from edgert.errors import ConfigError, ServiceError
from edgert.http_limits import BoundedHTTPServer

__all__ = ["CONTENT_TYPE", "MetricsObserver", "MetricsServer", "parse_listen", "render_metrics"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_QUANTILES = (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"))


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6, ``:9400`` for every interface) -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"--metrics {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9400")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port_text)


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, object]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    return repr(float(value))


class _Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: list[tuple[str, dict[str, object], float]] = []

    def add(self, value: float, labels: Mapping[str, object] | None = None) -> None:
        self.samples.append((self.name, dict(labels or {}), value))

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        for name, labels, value in self.samples:
            yield f"{name}{_labels(labels)} {_num(value)}"


def render_metrics(stats: Any | None, info: Mapping[str, object], ready: bool, started: float) -> str:
    """The exposition text for one pipeline. ``stats`` is the pipeline's PipelineStats (or None)."""
    fams: list[_Family] = []

    def family(name: str, kind: str, help_text: str) -> _Family:
        fams.append(_Family(name, kind, help_text))
        return fams[-1]

    family("edgert_info", "gauge", "Model, backend and version of this pipeline (value is always 1).").add(1, info)
    family("edgert_ready", "gauge", "1 once the model is loaded and the first frame is through.").add(int(ready))
    family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.").add(
        started)
    if stats is not None:
        family("edgert_frames_total", "counter", "Frames that went through every stage.").add(stats.frames)
        family("edgert_detections_total", "counter", "Detections handed to the sinks.").add(
            getattr(stats, "detections", 0))
        drops = family("edgert_dropped_frames_total", "counter", "Frames dropped, by reason.")
        for reason, count in sorted(dict(getattr(stats, "drops", {})).items()):
            drops.add(count, {"reason": reason})
        family("edgert_fps", "gauge", "Frames per second over the last frames.").add(stats.fps)
        family("edgert_average_fps", "gauge", "Frames per second since the first frame out.").add(
            getattr(stats, "average_fps", 0.0))
        lat = family("edgert_latency_seconds", "gauge", "Per-stage latency quantiles over the recent window.")
        for stage, q in stats.latency_ms().items():
            for key, quantile in _QUANTILES:
                lat.add(q[key] / 1000.0, {"stage": stage, "quantile": quantile})
        watts = getattr(stats, "watts", None)
        if watts is not None:
            family("edgert_power_watts", "gauge", "Board or GPU power draw measured by the power meter.").add(watts)
        sources = getattr(stats, "sources", None)
        if sources:
            _source_families(family, sources)
        counts = getattr(stats, "analytics_counts", None)
        if counts:
            _analytics_families(family, counts)
        speech = getattr(stats, "speech", None)
        if speech:
            _speech_families(family, speech)
    return "\n".join(line for fam in fams for line in fam.lines()) + "\n"


def _source_families(family: Any, sources: Mapping[str, Mapping[str, float]]) -> None:
    """Per-source figures of a pipeline with one or several sources (set by the pipeline as ``stats.sources``)."""
    frames = family("edgert_source_frames_total", "counter", "Frames of this source that went through every stage.")
    fps = family("edgert_source_fps", "gauge", "Frames per second of this source since its first frame out.")
    dropped = family("edgert_source_dropped_frames_total", "counter", "Frames of this source dropped or skipped.")
    reconnects = family("edgert_source_reconnects_total", "counter", "Times this source reconnected.")
    for name, figures in sorted(sources.items()):
        labels = {"source": name}
        frames.add(figures.get("frames", 0), labels)
        fps.add(figures.get("fps", 0.0), labels)
        dropped.add(figures.get("dropped", 0), labels)
        reconnects.add(figures.get("reconnects", 0), labels)


def _analytics_families(family: Any, counts: Mapping[str, Mapping[str, Mapping[str, float]]]) -> None:
    """Counting lines and zones from ``Analytics.counts()`` (set by the pipeline as ``stats.analytics_counts``)."""
    crossings = family("edgert_line_crossings_total", "counter", "Tracks that crossed a counting line, by direction.")
    occupancy = family("edgert_zone_occupancy", "gauge", "Tracks now inside a zone.")
    entries = family("edgert_zone_entries_total", "counter", "Tracks that entered a zone.")
    exits = family("edgert_zone_exits_total", "counter", "Tracks that left a zone (or were lost in it).")
    dwell = family("edgert_zone_dwell_seconds_total", "counter", "Seconds spent in a zone by tracks that left it.")
    for name, per_class in sorted(counts.items()):
        for cls, c in sorted(per_class.items()):
            if "in" in c:  # a line: {"in", "out"}
                for direction in ("in", "out"):
                    crossings.add(c[direction], {"line": name, "class": cls, "direction": direction})
            else:  # a zone: {"occupancy", "entered", "exited", "dwell_s"}
                labels = {"zone": name, "class": cls}
                occupancy.add(c.get("occupancy", 0), labels)
                entries.add(c.get("entered", 0), labels)
                exits.add(c.get("exited", 0), labels)
                dwell.add(c.get("dwell_s", 0.0), labels)


def _speech_families(family: Any, speech: Mapping[str, Any]) -> None:
    """A speech run's figures (set by the speech processor as ``stats.speech``)."""
    family("edgert_speech_audio_seconds_total", "counter", "Seconds of audio through the speech chain.").add(
        speech.get("audio_seconds", 0.0))
    rtf = family("edgert_speech_rtf", "gauge", "Real-time factor per speech stage (busy seconds per audio second).")
    for stage, value in sorted(dict(speech.get("rtf", {})).items()):
        rtf.add(value, {"stage": stage})
    family("edgert_speech_queue_depth", "gauge", "Speech segments waiting for Whisper's worker.").add(
        speech.get("queue_depth", 0))
    events = family("edgert_speech_events_total", "counter", "Speech events handed to the sinks, by kind.")
    for kind, n in sorted(dict(speech.get("events", {})).items()):
        events.add(n, {"kind": kind})
    family("edgert_speech_shed_windows_total", "counter", "Whisper windows skipped to stay within the power "
           "budget.").add(speech.get("shed_windows", 0))


class MetricsObserver:
    """A pipeline observer that remembers what the metrics endpoint reports. Cheap per frame."""

    def __init__(self, pipeline: str = "") -> None:
        from edgert._version import __version__

        self._lock = threading.Lock()
        self._info: dict[str, object] = {"pipeline": pipeline, "version": __version__, "model": "",
                                         "backend": ""}
        self._stats: Any = None
        self._ready = False
        self._started = time.time()

    def on_start(self, info: Any) -> None:
        with self._lock:
            for key in ("model", "backend", "source", "task"):
                value = info.get(key) if isinstance(info, Mapping) else getattr(info, key, None)
                if isinstance(value, Mapping):  # the pipeline describes its source as a dict with its uri
                    value = value.get("uri")
                if value is not None:
                    self._info[key] = value
            stats = info.get("stats") if isinstance(info, Mapping) else getattr(info, "stats", None)
            if stats is not None:
                self._stats = stats
            self._ready = True

    def on_frame(self, stats: Any) -> None:
        self._stats = stats  # one reference store; the numbers are read at scrape time

    def on_stop(self, summary: Any) -> None:
        with self._lock:
            self._ready = False

    def render(self) -> str:
        with self._lock:
            info, ready, stats = dict(self._info), self._ready, self._stats
        return render_metrics(stats, info, ready, self._started)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, code, ctype = self.server.render().encode(), 200, CONTENT_TYPE
        elif path == "/":
            body, code, ctype = b'<a href="/metrics">/metrics</a>\n', 200, "text/html; charset=utf-8"
        else:
            body, code, ctype = b"not found\n", 404, "text/plain; charset=utf-8"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s: " + format, self.address_string(), *args)


#: Prometheus scrapes one at a time; a few more for curl and a second scraper. Idle ones go after 10 s.
MAX_CLIENTS = 8


class _Server(BoundedHTTPServer):
    def __init__(self, address: tuple[str, int], render: Callable[[], str]) -> None:
        if ":" in address[0]:
            import socket

            self.address_family = socket.AF_INET6
        self.render = render
        super().__init__(address, _Handler, max_clients=MAX_CLIENTS)


class MetricsServer:
    """Serves ``render()`` at ``http://HOST:PORT/metrics`` from a daemon thread until :meth:`close`."""

    def __init__(self, host: str, port: int, render: Callable[[], str]) -> None:
        try:
            self._server = _Server((host, port), render)
        except OSError as exc:
            raise ServiceError(f"metrics endpoint: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self.host = host
        self.port = int(self._server.server_address[1])  # the real port when 0 was asked
        self._thread = threading.Thread(target=self._server.serve_forever, name="edgert-metrics", daemon=True)
        self._thread.start()
        log.info("metrics at http://%s:%d/metrics", host, self.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
