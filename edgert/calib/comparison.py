"""Run a reference and a candidate detector on the same frames and measure how far apart they are.

Both go through :class:`edgert.vision.detector.Detector`, so preprocessing and decoding are exactly the
runtime's. The reference keeps its configured confidence threshold (its detections are the ground
truth); the candidate decodes down to ``pred_conf`` (0.001, as COCO evaluations do) so a box that
drops from 0.26 to 0.24 costs a little precision rather than counting as missed. The strict figure,
with the candidate cut at the reference threshold too, is reported beside it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgert._lazy import lazy_import
from edgert.calib.accuracy import OutputErrors, detection_map, output_errors
from edgert.calib.dataset import CalibrationImages
from edgert.config import PipelineConfig
from edgert.errors import CalibrationError
from edgert.vision.detections import Detections

__all__ = ["PRED_CONF", "compare_detectors", "detections_on", "evaluation_frames", "video_frames"]

log = logging.getLogger(__name__)

#: Candidate threshold for mAP (COCO evaluations keep every box down to 0.001).
PRED_CONF = 0.001


def video_frames(path: str | Path, count: int, offset: float = 0.0) -> Iterator[tuple[str, np.ndarray]]:
    """``count`` frames spread evenly over the video: every k-th frame (k = frames // count), starting at
    frame ``offset * k`` (0.5: the frames halfway between those of offset 0, a disjoint set)."""
    from edgert.errors import SourceError
    from edgert.io.sources import VideoFileSource

    src = VideoFileSource(str(path), Path(path))
    try:
        src.open()
    except SourceError as exc:
        raise CalibrationError(str(exc)) from exc
    try:
        total = _frame_count(path) or count
        step = max(1, total // max(count, 1))
        first = int(offset * step) % step
        index = given = 0
        while given < count:
            frame = src.read()
            if frame is None:
                break
            if index % step == first:
                given += 1
                yield f"{Path(path).name}#{index}", frame
            index += 1
    finally:
        src.close()


def _frame_count(path: str | Path) -> int:
    cv2 = lazy_import("cv2", "reading video frames")
    cap = cv2.VideoCapture(str(path))
    try:
        return int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
    finally:
        cap.release()


def evaluation_frames(images: str | Path | None = None, video: str | Path | None = None, video_count: int = 50,
                      exclude: Iterable[Path] = ()) -> Iterator[tuple[str, np.ndarray]]:
    """Every image of ``images`` (minus ``exclude``), then ``video_count`` frames of ``video``."""
    if images is None and video is None:
        raise CalibrationError("nothing to compare on. Note: give --images DIR and/or --video PATH")
    if images is not None:
        folder = CalibrationImages(images, exclude=frozenset(Path(p) for p in exclude))
        for path, image in folder:
            yield path.name, image
    if video is not None:
        yield from video_frames(video, video_count)


def _with_conf(config: PipelineConfig, conf: float) -> PipelineConfig:
    return dataclasses.replace(config, decode=dataclasses.replace(config.decode, conf=conf))


def compare_detectors(reference: str | Path, candidate: str | Path, frames: Iterable[tuple[str, np.ndarray]],
                      config: PipelineConfig | None = None, backend: str = "onnxruntime",
                      candidate_backend: str | None = None, pred_conf: float = PRED_CONF,
                      progress: bool = False,
                      reference_results: tuple[Sequence[Detections], Sequence[dict[str, np.ndarray]]] | None = None,
                      ) -> dict[str, Any]:
    """Detections and raw outputs of ``candidate`` against ``reference`` on ``frames``; a JSON-able report.

    ``reference_results``: the reference's :func:`detections_on` of these frames (same config), when the
    caller compares several candidates on one frame set: the reference then does not run again."""
    from tqdm import tqdm

    from edgert.vision.detector import Detector

    config = config or PipelineConfig()
    ref_conf = float(config.decode.conf)
    ref_det = Detector(reference, config, backend=backend)
    try:
        cand_det = Detector(candidate, _with_conf(config, min(pred_conf, ref_conf)),
                            backend=candidate_backend or backend)
    except BaseException:
        ref_det.close()
        raise
    if tuple(ref_det.names) != tuple(cand_det.names):
        ref_det.close()
        cand_det.close()
        raise CalibrationError(
            f"{candidate}: detects other classes than {reference} ({len(cand_det.names)} vs {len(ref_det.names)}: "
            f"{_first_difference(ref_det.names, cand_det.names)}); its mAP against it would mean nothing. "
            "Note: compare a model with its own INT8/FP16 version or engine"
        )
    not_compared: set[str] = set()
    ref_list: list[Detections] = []
    cand_list: list[Detections] = []
    errors: dict[str, OutputErrors] = {}
    labels: list[str] = []
    t_ref = t_cand = 0.0
    try:
        for label, frame in tqdm(frames, desc="comparing", unit="frame", disable=not progress, leave=False):
            t0 = time.perf_counter()
            if reference_results is None:
                ref_list.append(ref_det(frame))
                ref_out = ref_det.session.outputs
            else:
                ref_list.append(reference_results[0][len(labels)])
                ref_out = reference_results[1][len(labels)]
            t1 = time.perf_counter()
            cand_list.append(cand_det(frame))
            t2 = time.perf_counter()
            t_ref += t1 - t0
            t_cand += t2 - t1
            # Raw outputs are compared where they are the same tensor (name and shape); a candidate with
            # another output layout (another export, NMS in the graph) is compared on detections only.
            cand_out = cand_det.session.outputs
            same = {n: v for n, v in cand_out.items() if n in ref_out and ref_out[n].shape == v.shape}
            not_compared.update(n for n in ref_out if n not in same)
            output_errors({n: ref_out[n] for n in same}, same, errors)
            labels.append(label)
    finally:
        ref_det.close()
        cand_det.close()
    if not labels:
        raise CalibrationError("no frames to compare on")
    if not_compared:
        log.warning("outputs %s differ in name or shape between the models: compared on detections only",
                    ", ".join(sorted(not_compared)))
    loose = detection_map(ref_list, cand_list)
    strict = detection_map(ref_list, cand_list, min_score=ref_conf)
    n = len(labels)
    return {
        "reference": str(reference), "candidate": str(candidate), "frames": n,
        "reference_conf": ref_conf, "candidate_conf": min(pred_conf, ref_conf),
        "map": loose.to_dict(), "map_strict": strict.to_dict(),
        "outputs": [e.to_dict() for e in errors.values()], "outputs_not_compared": sorted(not_compared),
        "reference_ms": round(1000 * t_ref / n, 2), "candidate_ms": round(1000 * t_cand / n, 2),
    }


def _first_difference(a: Sequence[str], b: Sequence[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"class {i} is {x!r} vs {y!r}"
    return f"class {min(len(a), len(b))} is missing in one"


def detections_on(model: str | Path, frames: Sequence[np.ndarray], config: PipelineConfig,
                  backend: str = "onnxruntime") -> tuple[list[Detections], list[dict[str, np.ndarray]]]:
    """Detections and copies of the raw outputs of ``model`` on in-memory ``frames`` (for sensitivity)."""
    from edgert.vision.detector import Detector

    dets: list[Detections] = []
    outs: list[dict[str, np.ndarray]] = []
    with Detector(model, config, backend=backend) as det:
        for frame in frames:
            dets.append(det(frame))
            outs.append({k: v.copy() for k, v in det.session.outputs.items()})
    return dets, outs

