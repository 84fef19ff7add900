"""The unit asks the source and sink rows what a pipeline needs, for every source and every sink.

A config with ``sources:`` (a CSI camera writing its own video, an RTSP stream) must order the unit on
nvargus-daemon and the network, keep /tmp (libargus' socket lives there) and allow every output folder;
a sink kind added by registration alone (a ``kafka://`` row marked remote) makes the unit wait for the
network without any change to the unit's code.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edgert.config import PipelineConfig, from_mapping
from edgert.errors import ServiceError
from edgert.io.sinks import SINKS, Sink, SinkKind, register_sink
from edgert.io.sinks.plan import config_sinks
from edgert.io.uri import scheme
from edgert.service.unit import UnitOptions, check_service_paths, output_paths, render_unit

OPTIONS = UnitOptions(name="yard", config_path="/etc/edgert/yard.yaml", edgert="/opt/edgert/venv/bin/edgert")


def _values(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


@pytest.fixture
def sinks_restored() -> Iterator[None]:
    saved = list(SINKS)
    yield
    SINKS[:] = saved


def _two_sources(**extra: object) -> PipelineConfig:
    return from_mapping(PipelineConfig, {
        "model": {"path": "/opt/models/m.onnx", "backend": "onnxruntime"},
        "sources": [
            {"uri": "csi://0", "name": "cam0", "sinks": ["/var/out/cam0.mp4"]},
            {"uri": "rtsp://10.0.0.7/stream", "name": "gate"},
        ],
        "sinks": ["jsonl:///var/log/edgert/{source}.jsonl"],
        **extra,
    })


def test_a_sources_config_gets_argus_network_tmp_and_every_output() -> None:
    text = render_unit(_two_sources(), OPTIONS)
    assert _values(text, "After") == ["nvargus-daemon.service", "network-online.target"]
    assert _values(text, "Wants") == ["nvargus-daemon.service", "network-online.target"]
    assert _values(text, "PrivateTmp") == ["no"]
    assert _values(text, "ReadWritePaths") == ["-/var/log/edgert", "-/var/out"]
    assert "csi://0, rtsp://10.0.0.7/stream" in _values(text, "Description")[0]


def test_the_placeholder_is_expanded_as_the_pipeline_names_sources() -> None:
    config = from_mapping(PipelineConfig, {
        "sources": [{"uri": "a.mp4", "name": "left"}, {"uri": "b.mp4"}],
        "sinks": ["/srv/{source}/out.mp4", "jsonl://-"],
    })
    assert config_sinks(config) == ["/srv/left/out.mp4", "/srv/1/out.mp4", "jsonl://-"]
    assert output_paths(config) == ["/srv/1", "/srv/left"]


def test_a_relative_second_source_is_refused_by_its_key() -> None:
    config = from_mapping(PipelineConfig, {"sources": [{"uri": "/srv/a.mp4"}, {"uri": "clips/b.mp4"}]})
    with pytest.raises(ServiceError, match=r"sources\[1\]\.uri 'clips/b.mp4' is relative"):
        check_service_paths(config, "yard")


def _never_made(uri: str, title: str) -> Sink:
    raise AssertionError("rendering a unit reads the sink's row; it never makes the sink")


def test_a_registered_remote_sink_makes_the_unit_wait_for_the_network(sinks_restored: None) -> None:
    config = from_mapping(PipelineConfig, {"model": {"path": "/opt/models/m.onnx", "backend": "onnxruntime"},
                                           "source": {"uri": "/srv/in.mp4"},
                                           "sinks": ["kafka://broker:9092/detections"]})
    with pytest.raises(ServiceError, match="unknown sink"):
        render_unit(config, OPTIONS)
    register_sink(SinkKind("kafka", "kafka://HOST:PORT/TOPIC", scheme("kafka://"),
                           _never_made, remote=True), before="folder")
    text = render_unit(config, OPTIONS)
    assert _values(text, "After") == ["network-online.target"]
    assert _values(text, "PrivateTmp") == ["yes"]
    assert _values(text, "ReadWritePaths") == []
