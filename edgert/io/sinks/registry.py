"""Choosing a sink from a URI: :data:`SINKS` is the one table of sink kinds.

Each row says how its URIs look (a scheme, or a test on the path) and makes the sink; the first row whose
test accepts the URI wins, so the scheme rows come before the path rows, and among those a folder before a
file. The unknown-sink error and the CLI help are written from the same rows. To add a sink: write its
module beside the others (a :class:`~edgert.io.sinks.base.Sink` and a ``from_uri(uri, title)``
factory) and add one row here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

from edgert.errors import SinkError
from edgert.io.sinks import display, image, jsonl, rtsp, video
from edgert.io.sinks.base import FrameResult, Sink, release_sinks
from edgert.io.sinks.callback import CallbackSink
from edgert.io.uri import insert_row, local_file, nothing, scheme
from edgert.jsonl_uri import jsonl_file

__all__ = ["SINKS", "SinkKind", "as_sink", "open_sink", "prepare_sinks", "register_sink", "sink_help", "sink_kind"]


@dataclass(frozen=True)
class SinkKind:
    """One kind of sink: ``accepts(uri)`` says whether a (stripped) URI is of this kind, ``make(uri, title)``
    builds the sink (not prepared), ``example`` is how a user writes it (help text and errors).

    The facts other rooms ask about (the service unit, docs) without parsing a URI themselves: ``writes(uri)``
    the local file or folder the sink writes, if any; ``remote``, whether it publishes to another machine (the
    service then waits for the network); ``check(uri)``, what can be judged of a URI before the service starts
    (raises :class:`~edgert.errors.SinkError`)."""

    name: str
    example: str
    accepts: Callable[[str], bool]
    make: Callable[[str, str], Sink]
    writes: Callable[[str], str | None] = nothing
    remote: bool = False
    check: Callable[[str], None] = nothing


def _web_preview(uri: str, title: str) -> Sink:
    from edgert.io.sinks.web.server import WebPreviewSink

    return WebPreviewSink.from_uri(uri, title)


def _mqtt(uri: str, title: str) -> Sink:
    from edgert.io.sinks.mqtt import MqttSink

    return MqttSink.from_uri(uri)


def _check_mqtt(uri: str) -> None:
    """Topic and options parsed, and no credentials: a unit's config is readable, the broker's password
    belongs in the service's EnvironmentFile."""
    _mqtt(uri, "edgert")


#: Every sink kind, in the order URIs are matched.
SINKS: list[SinkKind] = [
    SinkKind("jsonl", "jsonl://PATH, jsonl://-", scheme("jsonl://"), jsonl.from_uri, writes=jsonl_file),
    SinkKind("display", "display://0", scheme("display://"), display.from_uri),
    SinkKind("web", "http://127.0.0.1:8080", scheme("http://", "https://"), _web_preview),
    SinkKind("rtsp", "rtsp://...", scheme("rtsp://"), rtsp.from_uri, remote=True),
    SinkKind("mqtt", "mqtt://HOST:PORT/TOPIC, mqtts://...", scheme("mqtt://", "mqtts://"), _mqtt, remote=True,
             check=_check_mqtt),
    SinkKind("folder", "a folder ending in / (?every=N)", image.is_folder, image.folder_from_uri, writes=local_file),
    SinkKind("image", "out.jpg (or .png)", image.is_image_file, image.file_from_uri, writes=local_file),
    SinkKind("video", "out.mp4 (H.264; or .webm/.avi/.mkv/.mov)", video.is_video_file, video.from_uri,
             writes=local_file),
]


def register_sink(kind: SinkKind, before: str | None = None) -> None:
    """Add a sink kind (from a plugin or a test); ``before`` names the row it must be tried ahead of."""
    insert_row(SINKS, kind, before)


def sink_help() -> str:
    """How every sink kind is written, for help texts and the unknown-sink error."""
    return ", ".join(row.example for row in SINKS)


def sink_kind(uri: str) -> SinkKind:
    """The row of :data:`SINKS` that reads ``uri``; an unknown sink is a one-line :class:`SinkError`."""
    text = uri.strip()
    for row in SINKS:
        if row.accepts(text):
            return row
    raise SinkError(f"{uri}: unknown sink. Note: valid sinks are {sink_help()}")


def open_sink(uri: str, title: str = "edgert") -> Sink:
    """The sink for ``uri``, not yet opened."""
    return sink_kind(uri).make(uri.strip(), title)


def prepare_sinks(specs: Sequence[str | Sink], title: str = "edgert") -> list[Sink]:
    """Every sink of a run, prepared (checked, locked, bound) and not yet opened; nothing is truncated.

    Call it before opening any sink: when one cannot work, the ones already prepared are released
    (files they created removed, ports closed) and its one-line :class:`SinkError` is raised, so a run
    that does not start leaves every existing output as it was.
    """
    sinks: list[Sink] = []
    try:
        for spec in specs:
            sink = open_sink(spec, title) if isinstance(spec, str) else spec
            sinks.append(sink)
            sink.prepare()
    except BaseException:
        release_sinks(sinks[::-1])
        raise
    return sinks


def as_sink(spec: str | Sink | Callable[[FrameResult], Any], title: str = "edgert") -> Sink:
    """A sink from what a user may pass in ``sinks=[...]``: a URI, a :class:`Sink`, or a function of a result."""
    if isinstance(spec, str):
        return open_sink(spec, title)
    if isinstance(spec, Sink):
        return spec
    if callable(spec):
        return CallbackSink(spec)
    raise SinkError(f"{spec!r}: not a sink. Note: give a URI, a Sink, or a function taking a FrameResult")

