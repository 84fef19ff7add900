"""Where detections go, chosen by URI: JSON Lines, a video file, a window, a web preview, RTSP.

``open_sink(uri)`` returns a :class:`Sink` (not opened). Opening has two steps so that a run that cannot
start destroys nothing: ``prepare()`` checks and claims everything (the folder exists and is writable, the
output file is locked against a second run, the port is bound) without touching an existing output, and
``open(info)`` then truncates and starts writing. :func:`prepare_sinks` prepares every sink of a run (and
releases them all when one fails); only then does the pipeline open them (:func:`edgert.pipeline.sinks.open_sinks`).

A sink that fails mid-run (a full disk, a closed pipe, a deleted folder) is an error, not a log line: its
:class:`SinkWorker` records it (``failed``, ``error``, ``lost``), finalises the sink at once (a JSONL file
ends on its last whole line, a video is released) and takes no more frames.

The pipeline never calls a sink directly: each sink runs on its own thread behind a :class:`SinkWorker`,
which hands it frames through a bounded queue of preallocated image buffers. When the sink is slower
than the pipeline the queue is full, the frame is dropped for that sink and counted;
the pipeline never waits for a sink.

URIs: ``jsonl://events.jsonl``, ``jsonl://-`` (stdout), ``out.mp4`` / ``out.avi`` (annotated video),
``out.jpg`` (the last annotated frame, replaced atomically), ``frames/`` (one annotated image per frame;
``frames/?every=10`` every tenth), ``display://0`` (an OpenCV window), ``http://127.0.0.1:8080`` (web
preview: MJPEG stream + live stats; give another host such as 0.0.0.0 to serve beyond this machine),
``rtsp://server:8554/edgert`` (publish through GStreamer's rtspclientsink to an RTSP server such as mediamtx),
``mqtt://broker:1883/topic`` and ``mqtts://`` (publish JSON to an MQTT broker: :mod:`edgert.io.sinks.mqtt`).

The sink kinds and how their URIs look are one table, :data:`edgert.io.sinks.registry.SINKS`;
each kind is its own module here beside :mod:`~edgert.io.sinks.base`.

From Python, :class:`CallbackSink` hands every frame's :class:`FrameResult` to a function, on the sink's
own thread: ``Pipeline(config, sinks=[CallbackSink(on_frame)]).run()``.
"""

from __future__ import annotations

from edgert.errors import OutputClosed
from edgert.io.sinks.base import FrameResult, Sink, SinkWorker, StreamInfo, event_records, frame_record
from edgert.io.sinks.callback import CallbackSink
from edgert.io.sinks.display import DisplaySink
from edgert.io.sinks.image import ImageFileSink, ImageFolderSink
from edgert.io.sinks.jsonl import JsonlSink
from edgert.io.sinks.registry import SINKS, SinkKind, as_sink, open_sink, prepare_sinks, register_sink, sink_help
from edgert.io.sinks.rtsp import RtspSink, rtsp_out_pipeline
from edgert.io.sinks.video import VIDEO_SUFFIXES, VideoFileSink
from edgert.output_lock import lock_output

__all__ = [
    "SINKS",
    "VIDEO_SUFFIXES",
    "CallbackSink",
    "DisplaySink",
    "FrameResult",
    "ImageFileSink",
    "ImageFolderSink",
    "JsonlSink",
    "OutputClosed",
    "RtspSink",
    "Sink",
    "SinkKind",
    "SinkWorker",
    "StreamInfo",
    "VideoFileSink",
    "as_sink",
    "event_records",
    "frame_record",
    "lock_output",
    "open_sink",
    "prepare_sinks",
    "register_sink",
    "rtsp_out_pipeline",
    "sink_help",
]
