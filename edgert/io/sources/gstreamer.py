"""GStreamer for the sources: whether this OpenCV runs pipelines, and the pipeline strings of CSI cameras,
RTSP streams and (on a Jetson's capture worker) video files (pure functions, tested without GStreamer)."""

from __future__ import annotations

import re
from fractions import Fraction

from edgert.io.sources.base import _cv2

#: rtspsrc jitter buffer: small, so a late packet is dropped rather than delaying every frame after it.
RTSP_LATENCY_MS = 200


def gstreamer_available() -> bool:
    """Whether this OpenCV can run GStreamer pipelines (JetPack's can, the pip wheels cannot)."""
    try:
        info = _cv2().getBuildInformation()
    except Exception:  # BackendUnavailable, or an odd build: either way no GStreamer
        return False
    match = re.search(r"GStreamer:\s*(\S+)", info)
    return bool(match and match.group(1).upper().startswith("YES"))


# --------------------------------------------------------------------------------------------------
# GStreamer pipeline strings (pure functions: tested without GStreamer)


#: NVDEC's output (NVMM) brought back to system memory as BGRx by the Jetson's converter.
_NVDEC_TO_BGRX = "nvv4l2decoder ! nvvidconv ! video/x-raw, format=(string)BGRx ! "


def _bgr_appsink(every_frame: bool = False) -> str:
    """The tail of every pipeline here: raw video (BGRx) to the BGR OpenCV reads, into an unsynchronised appsink.
    Live sources keep only the newest buffer; a file (``every_frame``) keeps them all, paced by its reader."""
    if every_frame:
        sink = "appsink sync=false max-buffers=4 drop=false"
    else:
        sink = "appsink drop=true max-buffers=1 sync=false"
    return "videoconvert ! video/x-raw, format=(string)BGR ! " + sink


def _framerate(fps: float) -> str:
    nominal = round(fps * 1.001)
    if abs(fps - fps // 1) > 1e-6 and abs(fps - nominal * 1000 / 1001) < 0.01:
        return f"{nominal * 1000}/1001"  # NTSC rates: 29.97 means 30000/1001
    frac = Fraction(fps).limit_denominator(1001)
    return f"{frac.numerator}/{frac.denominator}"


def csi_pipeline(sensor_id: int, width: int = 1280, height: int = 720, fps: float = 30.0,
                 sensor_mode: int | None = None, flip: int = 0) -> str:
    """nvarguscamerasrc (Jetson ISP) -> NVMM NV12 -> nvvidconv (flip, to BGRx) -> BGR appsink."""
    mode = f" sensor-mode={sensor_mode}" if sensor_mode is not None else ""
    return (
        f"nvarguscamerasrc sensor-id={sensor_id}{mode} ! "
        f"video/x-raw(memory:NVMM), width=(int){width}, height=(int){height}, "
        f"framerate=(fraction){_framerate(fps)}, format=(string)NV12 ! "
        f"nvvidconv flip-method={flip} ! "
        f"video/x-raw, width=(int){width}, height=(int){height}, format=(string)BGRx ! "
        + _bgr_appsink()
    )


def rtsp_pipeline(uri: str, latency_ms: int = RTSP_LATENCY_MS, jetson: bool = False, codec: str = "h264") -> str:
    """rtspsrc with a small jitter buffer that drops late packets, decoded to BGR for appsink.

    On a Jetson the hardware decoder (nvv4l2decoder) writes NVMM memory, which nvvidconv brings back to
    system memory; elsewhere decodebin picks whatever decoder is installed.
    """
    head = f"rtspsrc location={uri} latency={latency_ms} drop-on-latency=true ! "
    if jetson:
        depay = {"h264": "rtph264depay ! h264parse", "h265": "rtph265depay ! h265parse"}[codec]
        body = f"{depay} ! {_NVDEC_TO_BGRX}"
    else:
        body = "decodebin ! "
    return head + body + _bgr_appsink()


def jetson_file_pipeline(path: str) -> str:
    """filesrc -> parsebin -> nvv4l2decoder (NVMM) -> nvvidconv (BGRx) -> videoconvert (BGR) -> appsink.

    ``parsebin`` finds the container's demuxer and the stream's parser, so one pipeline covers MP4, MKV and AVI
    with H.264 or H.265; appsink keeps every buffer (a file must not drop frames)."""
    location = path.replace("\\", "\\\\").replace('"', '\\"')
    return f'filesrc location="{location}" ! parsebin ! {_NVDEC_TO_BGRX}' + _bgr_appsink(every_frame=True)
