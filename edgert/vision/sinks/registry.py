"""Choosing a sink from a URI: :data:`SINKS` is the one table of sink kinds.

Each row says how its URIs look (a scheme, or a test on the path) and makes the sink; the first row whose
test accepts the URI wins, so the scheme rows come before the path rows, and among those a folder before a
file. The unknown-sink error and the CLI help are written from the same rows. To add a sink: write its
module beside the others (a :class:`~edgert.vision.sinks.base.Sink` and a ``from_uri(uri, title)``
factory) and add one row here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

from edgert.errors import SinkError
from edgert.vision.sinks import display, image, jsonl, rtsp, video
from edgert.vision.sinks.base import FrameResult, Sink, release_sinks
from edgert.vision.sinks.callback import CallbackSink
from edgert.vision.uri import insert_row, scheme

__all__ = ["SINKS", "SinkKind", "as_sink", "open_sink", "prepare_sinks", "register_sink", "sink_help"]



@dataclass(frozen=True)
class SinkKind:
    """One kind of sink: ``accepts(uri)`` says whether a (stripped) URI is of this kind, ``make(uri, title)``
    builds the sink (not prepared), ``example`` is how a user writes it (help text and errors)."""

    name: str
    example: str
    accepts: Callable[[str], bool]
    make: Callable[[str, str], Sink]


def _web_preview(uri: str, title: str) -> Sink:
    from edgert.vision.web.server import WebPreviewSink

    return WebPreviewSink.from_uri(uri, title)


def _mqtt(uri: str, title: str) -> Sink:
    from edgert.vision.sink_mqtt import MqttSink

    return MqttSink.from_uri(uri)


#: Every sink kind, in the order URIs are matched.
SINKS: list[SinkKind] = [
    SinkKind("jsonl", "jsonl://PATH, jsonl://-", scheme("jsonl://"), jsonl.from_uri),
    SinkKind("display", "display://0", scheme("display://"), display.from_uri),
    SinkKind("web", "http://127.0.0.1:8080", scheme("http://", "https://"), _web_preview),
    SinkKind("rtsp", "rtsp://...", scheme("rtsp://"), rtsp.from_uri),
    SinkKind("mqtt", "mqtt://HOST:PORT/TOPIC, mqtts://...", scheme("mqtt://", "mqtts://"), _mqtt),
    SinkKind("folder", "a folder ending in / (?every=N)", image.is_folder, image.folder_from_uri),
    SinkKind("image", "out.jpg (or .png)", image.is_image_file, image.file_from_uri),
    SinkKind("video", "out.mp4 (H.264; or .webm/.avi/.mkv/.mov)", video.is_video_file, video.from_uri),
]


def register_sink(kind: SinkKind, before: str | None = None) -> None:
    """Add a sink kind (from a plugin or a test); ``before`` names the row it must be tried ahead of."""
    insert_row(SINKS, kind, before)


def sink_help() -> str:
    """How every sink kind is written, for help texts and the unknown-sink error."""
    return ", ".join(row.example for row in SINKS)


def open_sink(uri: str, title: str = "edgert") -> Sink:
    """The sink for ``uri``, not yet opened."""
    text = uri.strip()
    for row in SINKS:
        if row.accepts(text):
            return row.make(text, title)
    raise SinkError(f"{uri}: unknown sink. Note: valid sinks are {sink_help()}")


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

