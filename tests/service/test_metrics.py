"""The metrics endpoint over real HTTP, parsed with prometheus-client's own parser."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import numpy as np
import pytest

from edgert.errors import ConfigError, ServiceError
from edgert.service.metrics import MetricsObserver, MetricsServer, parse_listen
from edgert.stats import STAGES, PipelineStats

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is in the test extra")


def _scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.headers["Content-Type"], resp.read().decode()


def test_endpoint_serves_valid_prometheus_text() -> None:
    observer = MetricsObserver(pipeline="front-door")
    stats = PipelineStats()
    with MetricsServer("127.0.0.1", 0, observer.render) as server:
        before = {f.name for f in parser.text_string_to_metric_families(_scrape(server.url)[1])}
        assert "edgert_frames" not in before  # no pipeline yet: info and readiness only
        observer.on_start({"model": "nanodet-m.onnx", "backend": "onnxruntime", "source": {"uri": "vtest.avi"},
                           "task": 'detect "quoted"\\'})
        stats.watts = 5.5
        stats.set_drops("stale", 2)
        for i in range(20):
            stats.record_frame(np.linspace(0.001, 0.02, len(STAGES)) * (1 + i % 3), detections=1)
            observer.on_frame(stats)
        ctype, text = _scrape(server.url)
    assert ctype.startswith("text/plain; version=0.0.4")
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    info = fams["edgert_info"].samples[0]
    assert info.labels["model"] == "nanodet-m.onnx" and info.labels["backend"] == "onnxruntime"
    assert info.labels["pipeline"] == "front-door" and info.labels["task"] == 'detect "quoted"\\'
    assert info.labels["source"] == "vtest.avi"
    assert fams["edgert_ready"].samples[0].value == 1
    assert fams["edgert_frames"].type == "counter" and fams["edgert_frames"].samples[0].value == 20
    assert fams["edgert_detections"].samples[0].value == 20
    drops = fams["edgert_dropped_frames"].samples
    assert [(s.labels["reason"], s.value) for s in drops] == [("stale", 2)]
    assert fams["edgert_fps"].samples[0].value > 0
    assert fams["edgert_power_watts"].samples[0].value == 5.5
    lat = {(s.labels["stage"], s.labels["quantile"]): s.value for s in fams["edgert_latency_seconds"].samples}
    assert set(lat) == {(st, q) for st in STAGES for q in ("0.5", "0.95", "0.99")}
    assert 0 < lat[("infer", "0.5")] <= lat[("infer", "0.99")] < 1.0


def test_other_paths_are_404_and_root_links_metrics() -> None:
    observer = MetricsObserver()
    with MetricsServer("127.0.0.1", 0, observer.render) as server:
        base = server.url.removesuffix("/metrics")
        assert "/metrics" in _scrape(base + "/")[1]
        with pytest.raises(urllib.error.HTTPError) as err:
            _scrape(base + "/nope")
        assert err.value.code == 404


def test_a_busy_port_is_a_one_line_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServiceError, match=f"cannot listen on 127.0.0.1:{port}"):
            MetricsServer("127.0.0.1", port, MetricsObserver().render)


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9400", ("127.0.0.1", 9400)), (":9400", ("0.0.0.0", 9400)), ("[::1]:9400", ("::1", 9400)),
])
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("bad", ["9400", "host:", "host:http", "127.0.0.1:70000"])
def test_parse_listen_rejects(bad: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_listen(bad)


def test_latency_histograms_per_stage_and_source_and_counts_by_source() -> None:
    """The fleet series: cumulative ``_bucket`` histograms per stage and source, events and line counts by source."""
    stats = PipelineStats()
    for i in range(30):
        source = "door" if i % 3 else "yard"
        events = [{"type": "line_cross", "line": "mid"}] if i % 5 == 0 else []
        stats.record_frame(np.full(len(STAGES), 0.004 * (1 + i % 4)), detections=1, source=source, events=events)
    stats.analytics_by_source = {"door": {"mid": {"person": {"in": 3, "out": 1}}},
                                 "yard": {"lot": {"car": {"occupancy": 2, "entered": 5, "exited": 3, "dwell_s": 9.5}}}}
    observer = MetricsObserver()
    observer.on_frame(stats)
    text = observer.render()
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    hist = fams["edgert_stage_latency_seconds"]
    assert hist.type == "histogram"
    buckets = [s for s in hist.samples if s.name.endswith("_bucket")]
    assert {(s.labels["stage"], s.labels["source"]) for s in buckets} == {(st, src) for st in STAGES
                                                                         for src in ("door", "yard")}
    infer_door = {s.labels["le"]: s.value for s in buckets
                  if s.labels["stage"] == "infer" and s.labels["source"] == "door"}
    door = [0.004 * (1 + i % 4) for i in range(30) if i % 3]
    assert infer_door["+Inf"] == len(door) == 20
    assert infer_door["0.005"] == sum(v <= 0.005 for v in door) and infer_door["0.01"] == sum(v <= 0.01 for v in door)
    values = list(infer_door.values())
    assert values == sorted(values)  # cumulative
    count = next(s.value for s in hist.samples if s.name.endswith("_count") and s.labels == {"stage": "infer",
                                                                                          "source": "yard"})
    assert count == 10
    events = {(s.labels["source"], s.labels["type"]): s.value for s in fams["edgert_events"].samples}
    assert events == {("yard", "line_cross"): 2, ("door", "line_cross"): 4}  # i in 0, 15 and 5, 10, 20, 25
    lines = {(s.labels["source"], s.labels["line"], s.labels["direction"]): s.value
             for s in fams["edgert_line_crossings"].samples}
    assert lines == {("door", "mid", "in"): 3, ("door", "mid", "out"): 1}
    zone = {s.labels["source"]: s.value for s in fams["edgert_zone_occupancy"].samples}
    assert zone == {"yard": 2}


def test_telemetry_gauges() -> None:
    stats = PipelineStats()
    stats.telemetry = {"temperatures_c": {"cpu": 51.5, "gpu": 49.0}, "clocks_mhz": {"gpu": 612.0},
                       "load": {"gpu": 0.42}, "throttle": ["thermal"], "fan_ratio": 0.3}
    observer = MetricsObserver()
    observer.on_frame(stats)
    fams = {f.name: f for f in parser.text_string_to_metric_families(observer.render())}
    assert {s.labels["zone"]: s.value for s in fams["edgert_temperature_celsius"].samples} == {"cpu": 51.5, "gpu": 49}
    assert fams["edgert_clock_hertz"].samples[0].value == 612e6
    assert fams["edgert_throttled"].samples[0].labels == {"reason": "thermal"}
    assert fams["edgert_fan_ratio"].samples[0].value == 0.3
