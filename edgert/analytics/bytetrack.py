"""ByteTrack in NumPy: edgert's own tracker, for every install (Python 3.8-3.12, NumPy 1.x and 2.x).

Why our own: Roboflow's ``trackers`` (which edgert used first) needs Python 3.10+, NumPy 2 and the
``opencv-python`` GUI wheel, none of which a JetPack 5/6 board can take (docs/tracking.md has the metadata
we checked, and the alternatives). This is a port of ``trackers`` 2.6.1's ``ByteTrackTracker`` with its
default corner (XYXY) Kalman state, in the timestamped mode edgert drives it in, so the two give the same
ids on the same detections (a comparison on vtest.avi checks it; the JSON is in
docs/results/). What is kept, on purpose, from that reference:

- the noise tuning of the original ByteTrack (measurement noise x0.1, process noise x0.01 of identity),
- the step of the filter in frame units, ``(t - t_prev) * frame_rate``, with the configured process noise
  within 4 ms of one nominal frame and white-noise-acceleration scaling for real gaps (dropped frames),
- the lost-track budget in seconds (``lost_track_buffer`` 30 fps frames), pruned before matching,
- a new track gets its id only when it is matched again (``minimum_consecutive_frames`` + 1 sightings).

Matching is the optimal assignment on IoU (:mod:`edgert.analytics.assignment`: SciPy when present, else a
faithful port of SciPy's algorithm).
"""

from __future__ import annotations

import math

import numpy as np

from edgert.analytics.assignment import assign_max, load_solver

__all__ = ["ByteTrack", "box_iou"]

_NOMINAL_TOLERANCE_S = 0.004  # a step within 4 ms of one frame keeps the tuned one-frame process noise
_POS = np.arange(4)
_VEL = np.arange(4, 8)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, M) IoU of xyxy boxes, computed in float64 and returned as float32 (as supervision does)."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)), np.float64)
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    iw = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0.0, None)
    ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0.0, None)
    inter = iw * ih
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    out = np.zeros(inter.shape, np.float32)
    np.divide(inter, union, out=out, where=union > 0, casting="unsafe")
    return out


class _Track:
    """One tracklet: an 8-state constant-velocity Kalman filter over the box corners and their speeds."""

    __slots__ = ("F", "P", "Q", "Q1", "R", "hits", "id", "missed", "missed_s", "step", "x")

    def __init__(self, box: np.ndarray) -> None:
        self.x = np.zeros((8, 1), np.float64)
        self.x[:4, 0] = np.asarray(box, np.float64)
        self.P = np.eye(8)
        self.R = np.eye(4) * 0.1
        self.Q1 = np.eye(8) * 0.01  # the one-frame process noise
        self.Q = self.Q1
        self.F = np.eye(8)
        self.step: float | None = None
        self.id = -1
        self.missed = 0  # predictions since the last match
        self.missed_s = 0.0  # seconds since the last match
        self.hits = 1  # consecutive matches, the first sighting included

    def _set_step(self, step: float, frame_rate: float) -> None:
        if step == self.step:
            return
        self.step = step
        self.F = np.eye(8)
        self.F[_POS, _VEL] = step
        if abs(step - 1.0) <= _NOMINAL_TOLERANCE_S * frame_rate:
            self.Q = self.Q1
            return
        sa2 = self.Q1[_VEL, _VEL]  # acceleration variance per axis, read off the one-frame noise
        q = np.zeros((8, 8))
        q[_POS, _POS] = sa2 * step ** 4 / 4.0
        q[_POS, _VEL] = q[_VEL, _POS] = sa2 * step ** 3 / 2.0
        q[_VEL, _VEL] = sa2 * step ** 2
        self.Q = q

    def predict(self, step: float, elapsed_s: float, frame_rate: float) -> None:
        self._set_step(step, frame_rate)
        self.x = self.F @ self.x
        self.P = self.F @ self.P @ self.F.T + self.Q
        if self.missed > 0:
            self.hits = 0
        self.missed += 1
        self.missed_s += elapsed_s

    def update(self, box: np.ndarray) -> None:
        z = np.asarray(box, np.float64).reshape(4, 1)
        y = z - self.x[:4]
        pht = self.P[:, :4]
        s = pht[:4] + self.R
        k = pht @ np.linalg.inv(s)
        self.x = self.x + k @ y
        ikh = np.eye(8)
        ikh[:, :4] -= k
        self.P = ikh @ self.P @ ikh.T + k @ self.R @ k.T  # Joseph form, as the reference
        self.missed = 0
        self.missed_s = 0.0
        self.hits += 1

    def box(self) -> np.ndarray:
        return self.x[:4, 0]


class ByteTrack:
    """Two-stage IoU tracking (confident detections first, then the rest to the tracks still unmatched).

    :meth:`update` takes one frame's xyxy boxes and confidences with the frame's time in seconds
    (increasing) and returns one id per input box, -1 where no confirmed track claims it.
    """

    def __init__(self, lost_track_buffer: int = 30, frame_rate: float = 30.0,
                 track_activation_threshold: float = 0.7, minimum_consecutive_frames: int = 2,
                 minimum_iou_threshold: float = 0.1, high_conf_det_threshold: float = 0.6) -> None:
        if lost_track_buffer < 0:
            raise ValueError(f"lost_track_buffer must be >= 0, got {lost_track_buffer}")
        if not (math.isfinite(frame_rate) and frame_rate > 0):
            raise ValueError(f"frame_rate must be a finite rate > 0, got {frame_rate}")
        self.frame_rate = float(frame_rate)
        self.max_lost_s = lost_track_buffer / 30.0
        self.activation = track_activation_threshold
        self.min_consecutive = minimum_consecutive_frames
        self.min_iou = minimum_iou_threshold
        self.high = high_conf_det_threshold
        self.tracks: list[_Track] = []
        self._next_id = 0
        self._last_t: float | None = None
        load_solver()  # before the first frame, not on it

    def reset(self) -> None:
        self.tracks = []
        self._next_id = 0
        self._last_t = None

    def _timing(self, timestamp: float) -> tuple[float, float] | None:
        last = self._last_t
        if last is None:
            self._last_t = timestamp
            elapsed = 1.0 / self.frame_rate
            return elapsed * self.frame_rate, elapsed
        if not timestamp > last:
            return None  # not later than the last frame: nothing to predict (the caller resets on rewinds)
        self._last_t = timestamp
        elapsed = timestamp - last
        return elapsed * self.frame_rate, elapsed

    def _match(self, tracks: list[_Track], boxes: np.ndarray, predicted: np.ndarray,
               ) -> tuple[list[tuple[int, int]], list[int], list[int]]:
        sim = box_iou(predicted, boxes)
        matched: list[tuple[int, int]] = []
        free_t = set(range(len(tracks)))
        free_d = set(range(len(boxes)))
        if sim.size:
            for r, c in zip(*assign_max(sim)):
                if sim[r, c] >= self.min_iou:
                    matched.append((int(r), int(c)))
                    free_t.discard(int(r))
                    free_d.discard(int(c))
        return matched, sorted(free_t), sorted(free_d)

    def _claim(self, track: _Track, box: np.ndarray) -> int:
        track.update(box)
        if track.hits >= self.min_consecutive and track.id == -1:
            track.id = self._next_id
            self._next_id += 1
        return track.id

    def update(self, xyxy: np.ndarray, confidence: np.ndarray, timestamp: float) -> np.ndarray:
        n = len(xyxy)
        ids = np.full(n, -1, np.int64)
        timing = self._timing(float(timestamp))
        if timing is None or (not self.tracks and n == 0):
            return ids
        step, elapsed = timing
        for t in self.tracks:
            t.predict(step, elapsed, self.frame_rate)
        self.tracks = [t for t in self.tracks if t.missed_s <= self.max_lost_s]
        boxes = np.asarray(xyxy, np.float64).reshape(-1, 4)
        # Kept in its own dtype: the split compares float32 confidences in float32, as the reference does.
        conf = np.asarray(confidence).reshape(-1)
        high = np.flatnonzero(conf >= self.high)
        low = np.flatnonzero(conf < self.high)
        predicted = np.array([t.box() for t in self.tracks]) if self.tracks else np.empty((0, 4))

        matched, free_tracks, free_high = self._match(self.tracks, boxes[high], predicted)
        for r, c in matched:
            ids[high[c]] = self._claim(self.tracks[r], boxes[high[c]])
        rest = [self.tracks[i] for i in free_tracks]
        matched, _, _ = self._match(rest, boxes[low], predicted[free_tracks] if free_tracks else np.empty((0, 4)))
        for r, c in matched:
            ids[low[c]] = self._claim(rest[r], boxes[low[c]])
        for c in free_high:
            if float(conf[high[c]]) >= self.activation:
                self.tracks.append(_Track(boxes[high[c]]))
        self.tracks = [t for t in self.tracks
                       if t.missed_s <= self.max_lost_s
                       and (t.id != -1 or t.hits >= self.min_consecutive or t.missed == 0)]
        return ids
