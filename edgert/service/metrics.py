"""An optional Prometheus endpoint: ``edgert run --metrics 127.0.0.1:9400`` serves ``/metrics``.

The exposition is written by ``prometheus_client`` (a core dependency: small, pure Python), from a
collector that reads the pipeline's live statistics when Prometheus scrapes, so a frame costs nothing here.
Latency is there twice: ``edgert_stage_latency_seconds`` histograms per stage and source since start
(cumulative ``_bucket`` series a fleet dashboard can sum and take quantiles of across boards), and the
older ``edgert_latency_seconds`` gauges with a ``quantile`` label over the recent window (kept: existing
dashboards read them). Names and labels: docs/fleet.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from edgert.errors import ConfigError, ServiceError
from edgert.http_limits import BoundedHTTPServer
from edgert.redact import redact
from edgert.stats import LATENCY_BUCKETS, STAGES

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


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels or [])


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels or [])  # exposed as NAME (ending in _total)


class _Snapshot:
    """The families of one scrape, collected by ``prometheus_client``."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def render_metrics(stats: Any | None, info: Mapping[str, object], ready: bool, started: float) -> str:
    """The exposition text for one pipeline. ``stats`` is the pipeline's PipelineStats (or None)."""
    fams: list[Metric] = []
    keys = sorted(str(k) for k in info)
    info_fam = _gauge("edgert_info", "Model, backend and version of this pipeline (value is always 1).", keys)
    info_fam.add_metric([str(info[k]) for k in keys], 1)
    fams.append(info_fam)
    ready_fam = _gauge("edgert_ready", "1 once the model is loaded and the first frame is through.")
    ready_fam.add_metric([], int(ready))
    fams.append(ready_fam)
    start_fam = _gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")
    start_fam.add_metric([], started)
    fams.append(start_fam)
    if stats is not None:
        fams.extend(_pipeline_families(stats))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(fams))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def _pipeline_families(stats: Any) -> Iterator[Metric]:
    frames = _counter("edgert_frames_total", "Frames that went through every stage.")
    frames.add_metric([], stats.frames)
    yield frames
    dets = _counter("edgert_detections_total", "Detections handed to the sinks.")
    dets.add_metric([], getattr(stats, "detections", 0))
    yield dets
    drops = _counter("edgert_dropped_frames_total", "Frames dropped or skipped, by reason.", ["reason"])
    for reason, count in sorted(dict(getattr(stats, "drops", {})).items()):
        drops.add_metric([reason], count)
    yield drops
    fps = _gauge("edgert_fps", "Frames per second over the last frames.")
    fps.add_metric([], stats.fps)
    yield fps
    avg = _gauge("edgert_average_fps", "Frames per second since the first frame out.")
    avg.add_metric([], getattr(stats, "average_fps", 0.0))
    yield avg
    lat = _gauge("edgert_latency_seconds", "Per-stage latency quantiles over the recent window.", ["stage", "quantile"])
    for stage, q in stats.latency_ms().items():
        for key, quantile in _QUANTILES:
            lat.add_metric([stage, quantile], q[key] / 1000.0)
    yield lat
    yield from _histograms(getattr(stats, "histograms", {}))
    events = _counter("edgert_events_total", "Analytics events (line_cross, zone_enter, zone_exit) by source.",
                      ["source", "type"])
    for (source, kind), count in sorted(dict(getattr(stats, "events", {})).items()):
        events.add_metric([source, kind], count)
    yield events
    watts = getattr(stats, "watts", None)
    if watts is not None:
        w = _gauge("edgert_power_watts", "Board or GPU power draw measured by the power meter.")
        w.add_metric([], watts)
        yield w
    telemetry = getattr(stats, "telemetry", None)
    if telemetry:
        yield from _telemetry_families(telemetry)
    sources = getattr(stats, "sources", None)
    if sources:
        yield from _source_families(sources)
    yield from _sink_families()
    by_source = dict(getattr(stats, "analytics_by_source", None) or {})
    if not by_source and getattr(stats, "analytics_counts", None):
        by_source = {"0": stats.analytics_counts}  # a stats object from before per-source counts
    if by_source:
        yield from _analytics_families(by_source)
    speech = getattr(stats, "speech", None)
    if speech:
        yield from _speech_families(speech)
    update = getattr(stats, "model_update", None)
    if update:
        yield from _model_update_families(update)


def _histograms(histograms: Mapping[str, Any]) -> Iterator[Metric]:
    fam = HistogramMetricFamily("edgert_stage_latency_seconds",
                                "Per-stage latency of every frame since start, by source.", labels=["stage", "source"])
    bounds = [repr(float(b)) for b in LATENCY_BUCKETS] + ["+Inf"]
    for source, hist in sorted(histograms.items()):
        cumulative, sums = hist.snapshot()
        for i, stage in enumerate(STAGES):
            fam.add_metric([stage, source], list(zip(bounds, cumulative[i].tolist())), float(sums[i]))
    yield fam


def _telemetry_families(t: Mapping[str, Any]) -> Iterator[Metric]:
    """Board telemetry (edgert.power.telemetry): temperatures per zone, clocks, loads, throttling, fan."""
    temps = _gauge("edgert_temperature_celsius", "Temperature of a thermal zone or GPU.", ["zone"])
    for zone, value in sorted(dict(t.get("temperatures_c", {})).items()):
        temps.add_metric([zone], value)
    yield temps
    clocks = _gauge("edgert_clock_hertz", "Current clock of a unit (gpu, emc, cpu, nvml sm/mem).", ["unit"])
    for unit, mhz in sorted(dict(t.get("clocks_mhz", {})).items()):
        clocks.add_metric([unit], float(mhz) * 1e6)
    yield clocks
    load = _gauge("edgert_load_ratio", "Busy fraction of a unit (gpu, emc), 0 to 1.", ["unit"])
    for unit, ratio in sorted(dict(t.get("load", {})).items()):
        load.add_metric([unit], ratio)
    yield load
    thr = _gauge("edgert_throttled", "1 while the board's own limits cut a clock, by reason.", ["reason"])
    for reason in sorted(t.get("throttle", [])):
        thr.add_metric([str(reason)], 1)
    yield thr
    if t.get("fan_ratio") is not None:
        fan = _gauge("edgert_fan_ratio", "Fan speed as a fraction of its maximum.")
        fan.add_metric([], t["fan_ratio"])
        yield fan


def _source_families(sources: Mapping[str, Mapping[str, float]]) -> Iterator[Metric]:
    """Per-source figures of a pipeline with one or several sources (set by the pipeline as ``stats.sources``)."""
    frames = _counter("edgert_source_frames_total", "Frames of this source that went through every stage.", ["source"])
    fps = _gauge("edgert_source_fps", "Frames per second of this source since its first frame out.", ["source"])
    dropped = _counter("edgert_source_dropped_frames_total", "Frames of this source dropped or skipped.", ["source"])
    reconnects = _counter("edgert_source_reconnects_total", "Times this source reconnected.", ["source"])
    down = _gauge("edgert_source_reconnecting", "1 while this live source is down and being reconnected.", ["source"])
    for name, figures in sorted(sources.items()):
        frames.add_metric([name], figures.get("frames", 0))
        fps.add_metric([name], figures.get("fps", 0.0))
        dropped.add_metric([name], figures.get("dropped", 0))
        reconnects.add_metric([name], figures.get("reconnects", 0))
        down.add_metric([name], figures.get("reconnecting", 0))
    yield from (frames, fps, dropped, reconnects, down)


def _sink_families() -> Iterator[Metric]:
    """Remote sinks' connection state (MQTT): connected 0/1, messages queued, messages lost."""
    from edgert.io.sinks.mqtt_health import sink_figures

    figures = sink_figures()
    if not figures:
        return
    connected = _gauge("edgert_sink_connected", "1 while this remote sink is connected to its broker.", ["sink"])
    queued = _gauge("edgert_sink_queued_messages", "Messages waiting for the broker's acknowledgement.", ["sink"])
    lost = _counter("edgert_sink_lost_messages_total", "Messages this sink dropped or could not deliver.", ["sink"])
    for f in sorted(figures, key=lambda f: str(f["sink"])):
        connected.add_metric([f["sink"]], f["connected"])
        queued.add_metric([f["sink"]], f["queued"])
        lost.add_metric([f["sink"]], f["lost"])
    yield from (connected, queued, lost)


def _analytics_families(by_source: Mapping[str, Any]) -> Iterator[Metric]:
    """Each source's rule counts (``Analytics.counts()``) as the series its rule kind's row names, by source."""
    from edgert.analytics.table import RULES, kind_of

    families: dict[str, Any] = {}
    for row in RULES:
        for spec in row.metrics:
            labels = ["source", row.kind, "class", *([spec.split] if spec.split else [])]
            make = _counter if spec.kind == "counter" else _gauge
            families.setdefault(spec.name, make(spec.name, spec.help, labels))
    for source, counts in sorted(by_source.items()):
        for name, per_class in sorted(dict(counts or {}).items()):
            kind = kind_of(per_class)
            for spec in kind.metrics if kind is not None else ():
                for cls, figures in sorted(per_class.items()):
                    if spec.split:
                        for figure in spec.figures:
                            if figure in figures:
                                families[spec.name].add_metric([source, name, cls, figure], figures[figure])
                    else:
                        families[spec.name].add_metric([source, name, cls], figures.get(spec.figures[0], 0))
    yield from families.values()


def _model_update_families(update: Mapping[str, Any]) -> Iterator[Metric]:
    """Model updates on the running pipeline (set by the update door as ``stats.model_update``)."""
    state = _gauge("edgert_model_update_state", "1 for the state of the latest model update (idle, queued, "
                   "building, checking, swapped, rejected, rolled back).", ["state", "model"])
    state.add_metric([str(update.get("state", "idle")), str(update.get("model", ""))], 1)
    yield state
    progress = update.get("progress")
    if progress is not None:
        build = _gauge("edgert_model_update_progress", "Percent done of the candidate being built and checked.")
        build.add_metric([], float(progress))
        yield build
    steps = _counter("edgert_model_updates_total", "Model update steps since start, by state.", ["state"])
    for name, count in sorted(dict(update.get("counts", {})).items()):
        steps.add_metric([name], count)
    yield steps
    generation = _gauge("edgert_model_generation", "Models swapped in since start (0: the one it started with).")
    generation.add_metric([], update.get("generation", 0))
    yield generation


def _speech_families(speech: Mapping[str, Any]) -> Iterator[Metric]:
    """A speech run's figures (set by the speech processor as ``stats.speech``)."""
    audio = _counter("edgert_speech_audio_seconds_total", "Seconds of audio through the speech chain.")
    audio.add_metric([], speech.get("audio_seconds", 0.0))
    rtf = _gauge("edgert_speech_rtf", "Real-time factor per speech stage (busy seconds per audio second).", ["stage"])
    for stage, value in sorted(dict(speech.get("rtf", {})).items()):
        rtf.add_metric([stage], value)
    depth = _gauge("edgert_speech_queue_depth", "Speech segments waiting for Whisper's worker.")
    depth.add_metric([], speech.get("queue_depth", 0))
    events = _counter("edgert_speech_events_total", "Speech events handed to the sinks, by kind.", ["kind"])
    for kind, n in sorted(dict(speech.get("events", {})).items()):
        events.add_metric([kind], n)
    shed = _counter("edgert_speech_shed_windows_total",
                    "Whisper windows skipped to stay within the power budget.")
    shed.add_metric([], speech.get("shed_windows", 0))
    yield from (audio, rtf, depth, events, shed)


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
                    if key == "source":  # a camera's password must not become a label
                        value = [redact(v) for v in value] if isinstance(value, list) else redact(value)
                    self._info[key] = value
            stats = info.get("stats") if isinstance(info, Mapping) else getattr(info, "stats", None)
            if stats is not None:
                self._stats = stats
            self._ready = True

    def on_frame(self, stats: Any) -> None:
        self._stats = stats  # one reference store; the numbers are read at scrape time

    on_frames = on_frame  # a batch at once (edgert.pipeline.observer): the same store

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
        # one address (a reconnecting slowloris) holds at most half: Prometheus still gets in
        super().__init__(address, _Handler, max_clients=MAX_CLIENTS, max_per_client=MAX_CLIENTS // 2)


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
        if host in ("", "0.0.0.0", "::"):
            log.warning("metrics listen on every interface (%s:%d): anyone on the network can read them. Note: "
                        "give --metrics 127.0.0.1:%d, or the address of the network Prometheus scrapes from",
                        host or "*", self.port, self.port)

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
