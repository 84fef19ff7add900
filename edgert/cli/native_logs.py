"""Keep the C libraries' own log lines (FFmpeg, OpenCV, GStreamer, PyAV's libav) out of a user's terminal.

A stream that does not open made FFmpeg and OpenCV print eight lines (``[tcp @ 0x...] Connection to ...
failed``, ``[ WARN:0@0.98] global cap.cpp:212 ...``) before edgert's one-line error, which now names the cause
itself (:mod:`edgert.io.sources.diagnose`). By default the CLI silences them; ``-v`` leaves each library at its
own default, and a variable the user set is never overridden. OpenCV reads these variables when ``cv2`` is
first imported (the CLI imports it later, in the subcommands), so they are set before.
"""

from __future__ import annotations

import logging
import os

__all__ = ["QUIET_ENV", "quiet_native_logs"]

#: Variable -> value that silences a library's own output.
QUIET_ENV = {
    "OPENCV_LOG_LEVEL": "SILENT",  # OpenCV's [ WARN:0@...] / [ERROR:0@...] lines
    "OPENCV_FFMPEG_LOGLEVEL": "-8",  # AV_LOG_QUIET: FFmpeg inside OpenCV ([tcp @ 0x...], [h264 @ 0x...])
    "GST_DEBUG": "0",  # GStreamer's debug log (none unless asked for)
}


def quiet_native_logs(verbosity: int) -> None:
    """At verbosity 0, silence the libraries (variables already set are kept); at -v and above, leave them."""
    if verbosity > 0:
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    logging.getLogger("libav").setLevel(logging.CRITICAL)  # PyAV routes FFmpeg's log through Python logging
