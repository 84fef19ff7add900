"""The one table of source kinds: :class:`SourceKind`, :data:`SOURCES` and its row makers (which URI is read
by which source), :func:`source_kind`, :func:`open_source`, :func:`register_source`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgert.config import SourceConfig
from edgert.errors import ConfigError, SourceError
from edgert.io.audio_sources import AUDIO_ROWS
from edgert.io.sources.base import IMAGE_SUFFIXES, FrameSource
from edgert.io.sources.diagnose import why_unreachable
from edgert.io.sources.files import ImageFilesSource, VideoFileSource, _image_paths
from edgert.io.sources.gstreamer import csi_pipeline, gstreamer_available, rtsp_pipeline
from edgert.io.sources.live import LiveSource, _ffmpeg_opener, _gst_opener, _need_gstreamer, _v4l2_opener
from edgert.io.uri import ARGUS, NETWORK, always, file_path_text, insert_row, local_file, no_needs, nothing, scheme
from edgert.redact import expand_env, redact


def _csi(uri: str, config: SourceConfig) -> FrameSource:
    sensor = uri[len("csi://"):] or "0"
    if not sensor.isdigit():
        raise SourceError(f"{uri}: expected csi://N with N the sensor id")
    _need_gstreamer(uri)
    width, height, fps = config.width or 1280, config.height or 720, config.fps or 30.0
    pipeline = csi_pipeline(int(sensor), width, height, fps, config.sensor_mode, config.flip)
    return LiveSource(uri, _gst_opener(pipeline), kind="csi", timeout=config.timeout_s)


def _gstreamer(uri: str, config: SourceConfig) -> FrameSource:
    pipeline = uri[len("gst://"):].strip()
    last = pipeline.rsplit("!", 1)[-1].strip()
    if not last.startswith("appsink"):
        raise SourceError(f"{uri}: a gst:// pipeline must end in appsink (e.g. '... ! videoconvert ! appsink')")
    _need_gstreamer(uri)
    return LiveSource(uri, _gst_opener(pipeline), kind="gstreamer", timeout=config.timeout_s)


def _rtsp(uri: str, config: SourceConfig) -> FrameSource:
    if gstreamer_available():
        from edgert.platform import jetson_info

        codec = "h265" if (config.fourcc or "").upper() in ("H265", "HEVC") else "h264"
        jetson = bool(jetson_info().get("is_jetson"))
        return LiveSource(uri, _gst_opener(rtsp_pipeline(uri, jetson=jetson, codec=codec)), kind="rtsp",
                          timeout=config.timeout_s, diagnose=lambda: why_unreachable(uri))
    return LiveSource(uri, _ffmpeg_opener(uri), kind="rtsp", timeout=config.timeout_s,
                      diagnose=lambda: why_unreachable(uri))


def _stream(uri: str, config: SourceConfig) -> FrameSource:
    return LiveSource(uri, _ffmpeg_opener(uri), kind="stream", timeout=config.timeout_s,
                      diagnose=lambda: why_unreachable(uri))


def _is_camera(uri: str) -> bool:
    return uri.startswith("v4l2://") or uri.isdigit() or re.fullmatch(r"/dev/video\d+", uri) is not None


def _v4l2(uri: str, config: SourceConfig, must_exist: bool = True) -> FrameSource:
    if uri.startswith("v4l2://"):
        return _camera(uri, uri[len("v4l2://"):], config, must_exist)
    return _camera(uri, f"/dev/video{uri}" if uri.isdigit() else uri, config, must_exist)


def _is_images(uri: str) -> bool:
    path_text = file_path_text(uri)
    if any(ch in path_text for ch in "*?["):
        return True
    path = Path(path_text).expanduser()
    return path.is_dir() or path.suffix.lower() in IMAGE_SUFFIXES


def _images(uri: str, config: SourceConfig) -> FrameSource:
    path_text = file_path_text(uri)
    if any(ch in path_text for ch in "*?["):
        paths = _image_paths(path_text)
        if not paths:
            raise SourceError(f"{uri}: no image files match this pattern")
        return ImageFilesSource(uri, paths, config.loop)
    path = Path(path_text).expanduser()
    if path.is_dir():
        paths = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise SourceError(f"{path}: folder has no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        return ImageFilesSource(uri, paths, config.loop)
    if not path.exists():
        raise SourceError(f"{path}: image file not found")
    return ImageFilesSource(uri, [path], config.loop)


def video_file_source(uri: str, config: SourceConfig, cls: type[VideoFileSource] = VideoFileSource) -> VideoFileSource:
    """A video file as ``config`` says (loop, stall timeout, realtime and its phase): one place for this row and for
    a Jetson capture worker's hardware-decoded file (:mod:`edgert.io.capture.jetson`), so neither drops a key."""
    return cls(uri, Path(file_path_text(uri)).expanduser(), config.loop, timeout=config.timeout_s,
               realtime=config.realtime, phase=config.realtime_phase)


@dataclass(frozen=True)
class SourceKind:
    """One kind of source: ``accepts(uri)`` says whether a (stripped) URI is of this kind, ``make(uri, config)``
    builds the source (not opened), ``example`` is how a user writes it.

    The facts other rooms ask about (the service unit, docs) without parsing a URI themselves: ``needs(uri)``
    what the source needs from the machine (:data:`~edgert.io.uri.ARGUS`,
    :data:`~edgert.io.uri.NETWORK`), ``reads(uri)`` the local path it reads, if any."""

    name: str
    example: str
    accepts: Callable[[str], bool]
    make: Callable[[str, SourceConfig], FrameSource]
    needs: Callable[[str], tuple[str, ...]] = no_needs
    reads: Callable[[str], str | None] = nothing


_NETWORK_ELEMENTS = ("rtspsrc", "souphttpsrc", "udpsrc", "tcpclientsrc")


def _gst_needs(uri: str) -> tuple[str, ...]:
    """What a hand-written GStreamer pipeline needs, read from the elements it names."""
    text = uri.lower()
    needs = (ARGUS,) if "nvarguscamerasrc" in text else ()
    return needs + ((NETWORK,) if any(e in text for e in _NETWORK_ELEMENTS) else ())


#: Every source kind, in the order URIs are matched: schemes first, then cameras, images, and last a video
#: file (which takes any other path). To add a source: a :class:`FrameSource` and one row here (before
#: ``video``, or through :func:`register_source`).
SOURCES: list[SourceKind] = [
    SourceKind("csi", "csi://N", scheme("csi://"), _csi, needs=always(ARGUS)),
    SourceKind("gstreamer", "gst://... ! appsink", scheme("gst://"), _gstreamer, needs=_gst_needs),
    SourceKind("rtsp", "rtsp://...", scheme("rtsp://", "rtsps://"), _rtsp, needs=always(NETWORK)),
    SourceKind("stream", "http://...", scheme("http://", "https://"), _stream, needs=always(NETWORK)),
    SourceKind("v4l2", "/dev/videoN (or N, v4l2://DEVICE)", _is_camera, _v4l2),
    *(SourceKind(*row) for row in AUDIO_ROWS),  # speech tasks' sources (edgert.io.audio_sources)
    SourceKind("images", "an image, a folder of images, a glob", _is_images, _images, reads=local_file),
    SourceKind("video", "a video file", lambda uri: True, video_file_source, reads=local_file),
]


def register_source(kind: SourceKind, before: str = "video") -> None:
    """Add a source kind (a plugin, a test), tried ahead of the row named ``before``."""
    insert_row(SOURCES, kind, before)


def source_help() -> str:
    """How every source kind is written, for help texts."""
    return ", ".join(row.example for row in SOURCES)


class UnopenedSource(FrameSource):
    """A source that could not even be made (a missing file or device node, an empty folder), one of several:
    it fails at ``open``, where the run drops a source that does not open and goes on with the others."""

    kind = "unopened"

    def __init__(self, uri: str, error: SourceError) -> None:
        super().__init__(uri)
        self.error = error

    def open(self) -> None:
        raise self.error

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        return None

    def close(self) -> None:
        """Nothing was opened, so nothing is released."""


def open_source(source: SourceConfig | str, among: int = 1) -> FrameSource:
    """The source for a URI (or a :class:`SourceConfig`), not yet opened: use it in a ``with`` block.

    With ``among`` > 1 (the run's source count) a source that cannot be made fails at ``open`` instead: a
    camera's device node that is absent is retried like a network camera that is down (it may be plugged in or
    come up later), anything else (a missing file, an empty folder) drops out of the run as a file that does
    not open does; alone, either is the run's one-line error at once."""
    if among > 1:
        try:
            return open_source(source, 1)
        except SourceError as exc:
            config = SourceConfig(uri=source) if isinstance(source, str) else source
            uri = config.uri.strip()
            if source_kind(uri).name == "v4l2":
                return _v4l2(uri, config, must_exist=False)
            return UnopenedSource(uri, exc)
    config = SourceConfig(uri=source) if isinstance(source, str) else source
    uri = config.uri.strip()
    if not uri:
        raise SourceError("no source given. Note: pass --source URI (a video, image, folder, /dev/videoN, csi://N, "
                          "rtsp://...)")
    row = source_kind(uri)
    if row.name == "video":
        _refuse_unknown_scheme(uri)
    elif config.realtime:  # a camera or stream has its own rate already; images have none
        raise ConfigError(f"source.realtime (--realtime): {redact(uri)} is a {row.name} source; only a video file "
                          "is played at its own frame rate")
    if "://" not in uri or uri.startswith("file://"):
        return row.make(uri, config)
    # A network URI may name its credentials as ${VAR}: only the opener sees them expanded.
    made = row.make(expand_env(uri), config)
    made.uri = redact(uri)
    return made


#: Schemes other tools use that edgert does not read, and what to do instead.
_OTHER_SCHEMES = {
    "rtp": "receive it with gst://udpsrc port=PORT caps=application/x-rtp,... ! rtph264depay ! ... ! appsink",
    "webrtc": "publish the stream as RTSP and read rtsp://...",
}


def _refuse_unknown_scheme(uri: str) -> None:
    """``rtp://@:1234`` is not a file called ``rtp:/@:1234``: a URI of a scheme no source reads is refused."""
    import re

    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):/", uri)
    if match is None or uri.startswith("file://"):
        return
    name = match.group(1).lower()
    hint = _OTHER_SCHEMES.get(name, f"sources are {source_help()}")
    raise SourceError(f"{redact(uri)}: {name}:// sources are not supported. Note: {hint}")


def source_kind(uri: str) -> SourceKind:
    """The row of :data:`SOURCES` a URI is read by (the last row takes any path)."""
    text = uri.strip()
    return next(row for row in SOURCES if row.accepts(text))


def _camera(uri: str, device: str, config: SourceConfig, must_exist: bool = True) -> LiveSource:
    if must_exist and not Path(device).exists():
        raise SourceError(f"{device}: no such camera device. Note: `edgert info` lists the cameras it sees")
    return LiveSource(uri, _v4l2_opener(device, config), kind="v4l2", timeout=config.timeout_s)
