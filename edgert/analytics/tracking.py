"""Multi-object tracking: ByteTrack by edgert's own NumPy port, SORT and OC-SORT through ``trackers``.

``tracker: bytetrack`` (the default) runs :mod:`edgert.analytics.bytetrack`, which installs wherever edgert
does (Python 3.8-3.12, NumPy 1.x and 2.x, no OpenCV wheel; ``[track]`` adds only SciPy for the assignment).
``sort`` and ``ocsort`` are Roboflow's ``trackers`` package (Apache-2.0; Python 3.10+, NumPy 2 and the
``opencv-python`` wheel, so not on JetPack 5/6: docs/tracking.md), imported only when such a tracker is
made. ``implementation="trackers"`` runs trackers' own ByteTrack instead, which
a comparison on vtest.avi used to show the two give the same tracks (docs/results/README.md).

The tracker is stepped by frame index (``timestamp = frame_index / frame_rate``) rather than by wall
clock: a video file decoded faster than real time then tracks as it would at its own rate, and frames a
live source dropped (gaps in the index) widen the prediction step as they should.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.analytics.bytetrack import ByteTrack
from edgert.config import TRACKERS, TrackConfig
from edgert.vision.detections import Detections

__all__ = ["Tracker"]


def _load_trackers() -> Any:
    return lazy_import("trackers", "object tracking")


class Tracker:
    """Gives every detection of a stream the id of the track it belongs to.

    ``update`` returns the detections in their input order with ``track_id`` set. Detections that no
    track claims (low confidence, not yet confirmed) are left out, as supervision and Ultralytics do,
    unless ``keep_untracked`` keeps them with ``track_id`` -1.
    """

    def __init__(self, impl: Any, config: TrackConfig, frame_rate: float) -> None:
        self._impl = impl
        self.config = config
        self.frame_rate = frame_rate
        self._own = isinstance(impl, ByteTrack)
        self._sv = None if self._own else lazy_import("supervision", "object tracking")
        self.lengths: dict[int, int] = {}  # track id -> frames it was seen in (for summaries and checks)
        self.spans: dict[int, tuple[float, float]] = {}  # track id -> media time first and last seen
        self._last_index: int | None = None

    @classmethod
    def from_config(cls, config: TrackConfig, fps: float | None = None, implementation: str = "edgert") -> Tracker:
        """A tracker for ``config``; ``fps`` is the source's rate, used when ``config.frame_rate`` is None.

        ``implementation`` "edgert" runs ByteTrack by edgert's port (SORT/OC-SORT always need ``trackers``);
        "trackers" runs Roboflow's class for every tracker.
        """
        if implementation not in ("edgert", "trackers"):
            raise ValueError(f"unknown tracker implementation {implementation!r}: expected edgert or trackers")
        rate = float(config.frame_rate or fps or 30.0)
        if config.tracker == "bytetrack" and implementation == "edgert":
            own = ByteTrack(lost_track_buffer=config.lost_track_buffer, frame_rate=rate,
                            track_activation_threshold=config.track_activation_threshold,
                            minimum_consecutive_frames=config.minimum_consecutive_frames,
                            minimum_iou_threshold=config.minimum_iou_threshold,
                            high_conf_det_threshold=config.high_conf_det_threshold)
            return cls(own, config, rate)
        trackers = _load_trackers()
        klass = getattr(trackers, TRACKERS[config.tracker])
        wanted = {
            "lost_track_buffer": config.lost_track_buffer,
            "frame_rate": rate,
            "track_activation_threshold": config.track_activation_threshold,
            "minimum_consecutive_frames": config.minimum_consecutive_frames,
            "minimum_iou_threshold": config.minimum_iou_threshold,
            "high_conf_det_threshold": config.high_conf_det_threshold,
        }
        # SORT and OC-SORT take a subset of ByteTrack's parameters (SORT has no second, low-confidence stage).
        accepted = inspect.signature(klass.__init__).parameters
        impl = klass(**{k: v for k, v in wanted.items() if k in accepted})
        return cls(impl, config, rate)

    def reset(self) -> None:
        self._impl.reset()
        self.lengths.clear()
        self.spans.clear()
        self._last_index = None

    def update(self, detections: Detections, frame_index: int, timestamp: float | None = None) -> Detections:
        """Detections of frame ``frame_index`` (increasing) with ``track_id``. The tracker steps by frame
        index; ``timestamp`` (the frame's media time) only dates the tracks, for their ages."""
        if self._last_index is not None and frame_index <= self._last_index:
            self.reset()  # a looped video or a restarted source: the old tracks mean nothing now
        self._last_index = frame_index
        n = len(detections)
        if self._own:
            ids = self._impl.update(detections.xyxy.astype(np.float32, copy=False), detections.confidence,
                                    frame_index / self.frame_rate)
            return self._keep(detections, ids, timestamp)
        assert self._sv is not None
        sv_in = self._sv.Detections(
            xyxy=detections.xyxy.astype(np.float32, copy=False),
            confidence=detections.confidence,
            class_id=detections.class_id,
            data={"edgert_index": np.arange(n)},
        )
        out = self._impl.update(sv_in, timestamp=frame_index / self.frame_rate)
        ids = np.full(n, -1, np.int64)
        if len(out):
            ids[np.asarray(out.data["edgert_index"], np.int64)] = np.asarray(out.tracker_id, np.int64)
        return self._keep(detections, ids, timestamp)

    def _keep(self, detections: Detections, ids: np.ndarray, timestamp: float | None) -> Detections:
        tracked = detections.with_track_id(ids)
        if not self.config.keep_untracked:
            tracked = tracked[ids >= 0]
        for tid in ids[ids >= 0].tolist():
            self.lengths[tid] = self.lengths.get(tid, 0) + 1
            if timestamp is not None:
                first = self.spans.get(tid, (timestamp, timestamp))[0]
                self.spans[tid] = (first, timestamp)
        return tracked

    def summary(self) -> dict[str, Any]:
        lengths = list(self.lengths.values())
        return {
            "tracker": self.config.tracker,
            "tracks": len(lengths),
            "mean_track_frames": round(float(np.mean(lengths)), 2) if lengths else 0.0,
            # media time from a track's first frame to its last (its age when it ended)
            "mean_track_s": round(float(np.mean([b - a for a, b in self.spans.values()])), 3) if self.spans else 0.0,
        }
