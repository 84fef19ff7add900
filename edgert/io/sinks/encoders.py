"""Video encoders for the video file sink, and the order they are tried in per container.

Browsers, phones and chat apps play H.264 in MP4 and VP8/VP9 in WebM; they refuse MPEG-4 Part 2
(OpenCV's ``mp4v``, the only MP4 codec pip's OpenCV can write). So ``.mp4`` tries, in order: PyAV's
libx264 (``pip install 'edgert[video]'``: PyAV's wheels carry libx264), GStreamer's ``nvv4l2h264enc``
(Jetson's hardware encoder) and ``x264enc`` through an OpenCV built with GStreamer (JetPack's), and only
then OpenCV's ``mp4v``, a fallback the sink names in a warning and in the run's summary. ``.webm`` takes
VP9 or VP8 from PyAV, else OpenCV's own VP8/VP9 where its FFmpeg has them. ``?codec=`` on the URI picks
one (``out.mp4?codec=mp4v``).

Every encoder has the same three calls as ``cv2.VideoWriter`` (``isOpened``, ``write(bgr)``, ``release``),
so the sink does not care which one it holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgert._lazy import lazy_import

__all__ = ["CODECS_BY_SUFFIX", "Encoder", "encoder_chain", "gst_pipeline", "open_encoder"]

log = logging.getLogger(__name__)


#: MP4 and QuickTime files are written fragmented: a fragment (its own index, ``moof``, and its frames) at each
#: keyframe and at least every 2 s of video, instead of one index of every frame written at the end (``moov``).
#: The muxer then holds one fragment in memory (2 s of compressed video at most: a fragment's frames wait for
#: its index), not 64 bytes per frame of the whole file for as long as the run lasts (heaptrack on
#: ``scripts/soak.py``: the last native allocation that grew with the run, +295 KB in 5 000 frames over 4
#: files); and a run killed before it can close the file (SIGKILL, power loss) leaves a video that plays up to
#: its last fragment instead of one without an index (``flush_packets``: each fragment goes to the file when it
#: is cut, not when the I/O buffer fills). Browsers, VLC, FFmpeg and OpenCV play, seek and count them as before;
#: the file is the same size (the keyframes are x264's own).
_FRAGMENTED = {"movflags": "frag_keyframe+empty_moov+default_base_moof", "frag_duration": "2000000",
               "flush_packets": "1"}


def _container_options(path: Path) -> dict[str, str]:
    return dict(_FRAGMENTED) if path.suffix.lower() in (".mp4", ".m4v", ".mov") else {}


class _PyAVWriter:
    """``cv2.VideoWriter``'s calls over a PyAV container (libx264, libvpx).

    Each frame is converted from BGR into one YUV 4:2:0 frame made at open and reused (``cv2.cvtColor``, then
    the three planes copied into the frame's own, whose rows may be padded). ``VideoFrame.from_ndarray`` and the
    encoder's reformatter made three new frame-sized buffers per frame instead (the BGR image as bytes, a BGR
    frame, the YUV frame: 1.3 + 1.3 + 0.66 MB at 768x576): two were mapped and unmapped each frame, and the
    third came from glibc's arenas, where, with four video sinks on their own threads, a new high of them at
    once now and then left the heap one YUV frame larger for good (heaptrack on ``scripts/soak.py``: those
    three the only frame-sized allocations per frame; docs/fleet.md). The encoders keep no reference to the
    frame after ``encode`` (libx264 and libvpx copy it in, and FFmpeg lets go of it once the encoder has run);
    where PyAV has ``make_writable`` (18 has, 12 has not) it copies the frame first if one still did.
    """

    def __init__(self, path: Path, codec: str, fps: float, size: tuple[int, int]) -> None:
        self._container: Any = None
        self._stream: Any = None
        self._frame: Any = None  # the one YUV 4:2:0 frame every image is converted into
        self._yuv: np.ndarray | None = None  # cv2's I420 output (Y rows, then U, then V), reused
        self._sent = 0  # frames given to the encoder: each one's pts
        try:
            av = lazy_import("av", "H.264/VP9 video (pip install 'edgert[video]')")
            av.codec.Codec(codec, "w")  # raises when this PyAV lacks the encoder
            container = av.open(str(path), "w", container_options=_container_options(path))
            stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
            stream.width, stream.height = size
            stream.pix_fmt = "yuv420p"
            if codec == "libx264":  # players need yuv420p (the index comes first: fragmented, empty_moov)
                stream.options = {"crf": "23", "preset": "veryfast"}
            elif codec.startswith("libvpx"):
                stream.options = {"crf": "32", "b": "0", "deadline": "realtime", "cpu-used": "8"}
            self._container, self._stream, self._av = container, stream, av
            self._frame = av.VideoFrame(size[0], size[1], "yuv420p")
            self._yuv = np.empty((size[1] * 3 // 2, size[0]), np.uint8)
        except Exception as exc:  # no PyAV, no such encoder, an unwritable path: not this encoder
            log.debug("PyAV %s for %s not available: %s", codec, path, exc)
            self.close_quietly()

    def isOpened(self) -> bool:  # cv2.VideoWriter's name
        return self._container is not None

    def write(self, image: np.ndarray) -> None:
        cv2 = lazy_import("cv2", "writing video files")
        frame, yuv = self._frame, self._yuv
        assert frame is not None and yuv is not None
        height, width = yuv.shape[0] * 2 // 3, yuv.shape[1]
        if image.shape[:2] != (height, width):  # the sink fits every image to the size given at open
            raise ValueError(f"a {image.shape[1]}x{image.shape[0]} image for a {width}x{height} video")
        cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420, dst=yuv)
        make_writable = getattr(frame, "make_writable", None)  # newer PyAV (not 12)
        if make_writable is not None:
            make_writable()  # a no-op unless the encoder still holds the previous frame's buffers
        quarter = height // 2 * (width // 2)
        chroma = yuv[height:].reshape(-1)
        for plane, rows, cols, pixels in ((0, height, width, yuv[:height]),
                                          (1, height // 2, width // 2, chroma[:quarter]),
                                          (2, height // 2, width // 2, chroma[quarter:2 * quarter])):
            target = frame.planes[plane]
            view = np.frombuffer(target, np.uint8).reshape(-1, target.line_size)[:rows, :cols]
            np.copyto(view, pixels.reshape(rows, cols))
        frame.pts = self._sent  # the encoder would set it once (a new frame's), and a reused frame keeps it
        self._sent += 1
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def release(self) -> None:
        if self._container is None:
            return
        try:
            for packet in self._stream.encode():  # flush the encoder's delayed frames
                self._container.mux(packet)
        finally:
            self.close_quietly()

    def close_quietly(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            try:
                container.close()
            except Exception as exc:  # closing what failed to open: the open's failure is what counts
                log.debug("PyAV close: %s", exc)


def _cv2_writer(path: Path, fourcc: str, fps: float, size: tuple[int, int]) -> Any:
    cv2 = lazy_import("cv2", "writing video files")
    return cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, size)


def _has_gstreamer() -> bool:
    cv2 = lazy_import("cv2", "writing video files")
    info = cv2.getBuildInformation()
    return any(line.strip().startswith("GStreamer:") and "YES" in line for line in info.splitlines())


_MUXERS = {".mp4": "mp4mux", ".m4v": "mp4mux", ".mov": "qtmux", ".mkv": "matroskamux"}
#: MP4 and MOV fragmented every 2 s, as the PyAV writer does (_FRAGMENTED): a run killed mid-file leaves a file
#: that plays up to its last fragment, and the muxer keeps no index that grows with the run.
_FRAGMENT_MS = {"mp4mux": 2000, "qtmux": 2000}


def gst_pipeline(element: str, path: Path) -> str:
    """The GStreamer pipeline OpenCV's writer feeds (from ``appsrc``): convert, encode with ``element``, mux for
    ``path``'s container, write."""
    mux = _MUXERS.get(path.suffix.lower(), "mp4mux")
    if element == "nvv4l2h264enc":  # Jetson's encoder reads NVMM NV12 from nvvidconv
        encode = ("video/x-raw,format=BGRx ! nvvidconv ! video/x-raw(memory:NVMM),format=NV12 ! "
                  "nvv4l2h264enc insert-sps-pps=true")
    else:
        encode = "video/x-raw,format=I420 ! x264enc speed-preset=veryfast"
    fragment = _FRAGMENT_MS.get(mux)
    muxer = f"{mux} fragment-duration={fragment}" if fragment else mux
    location = str(path).replace('"', '\\"')
    return f'appsrc ! videoconvert ! {encode} ! h264parse ! {muxer} ! filesink location="{location}"'


def _gst_writer(element: str) -> Callable[[Path, float, tuple[int, int]], Any]:
    """An OpenCV GStreamer writer into ``element`` (JetPack's OpenCV has GStreamer; pip's has not)."""
    def make(path: Path, fps: float, size: tuple[int, int]) -> Any:
        cv2 = lazy_import("cv2", "writing video files")
        if not _has_gstreamer():
            return None
        return cv2.VideoWriter(gst_pipeline(element, path), cv2.CAP_GSTREAMER, 0, fps, size, True)
    return make


@dataclass(frozen=True)
class Encoder:
    """One way to write a container: ``codec`` is what the user may ask for (``?codec=``), ``label`` what
    the summary says, ``fallback`` marks output most players refuse."""

    codec: str
    label: str
    make: Callable[[Path, float, tuple[int, int]], Any]
    fallback: bool = False


def _pyav(codec: str) -> Callable[[Path, float, tuple[int, int]], Any]:
    return lambda path, fps, size: _PyAVWriter(path, codec, fps, size)


def _opencv(fourcc: str) -> Callable[[Path, float, tuple[int, int]], Any]:
    return lambda path, fps, size: _cv2_writer(path, fourcc, fps, size)


_H264 = (
    Encoder("h264", "H.264 (PyAV libx264)", _pyav("libx264")),
    Encoder("h264", "H.264 (GStreamer nvv4l2h264enc)", _gst_writer("nvv4l2h264enc")),
    Encoder("h264", "H.264 (GStreamer x264enc)", _gst_writer("x264enc")),
    Encoder("mp4v", "MPEG-4 Part 2 (OpenCV mp4v)", _opencv("mp4v"), fallback=True),
)
_WEBM = (
    Encoder("vp9", "VP9 (PyAV libvpx-vp9)", _pyav("libvpx-vp9")),
    Encoder("vp8", "VP8 (PyAV libvpx)", _pyav("libvpx")),
    Encoder("vp9", "VP9 (OpenCV VP90)", _opencv("VP90")),
    Encoder("vp8", "VP8 (OpenCV VP80)", _opencv("VP80")),
)

#: Container suffix -> the encoders tried for it, best first.
CODECS_BY_SUFFIX: dict[str, tuple[Encoder, ...]] = {
    ".mp4": _H264, ".m4v": _H264, ".mov": _H264, ".mkv": _H264, ".webm": _WEBM,
    ".avi": (Encoder("mjpg", "Motion-JPEG (OpenCV MJPG)", _opencv("MJPG")),),
}


def encoder_chain(suffix: str, codec: str | None = None) -> tuple[Encoder, ...]:
    """The encoders for ``suffix``, or only those of ``codec`` (empty when the container has no such codec)."""
    chain = CODECS_BY_SUFFIX.get(suffix.lower(), ())
    if codec:
        chain = tuple(e for e in chain if e.codec == codec.lower())
    return chain


def open_encoder(chain: tuple[Encoder, ...], path: Path, fps: float,
                 size: tuple[int, int]) -> tuple[Encoder, Any] | tuple[None, None]:
    """The first encoder of ``chain`` that opens ``path``, with its writer."""
    for encoder in chain:
        writer = encoder.make(path, fps, size)
        if writer is not None and writer.isOpened():
            return encoder, writer
        if writer is not None:
            writer.release()
    return None, None
