"""The check after calibrating: the frames it judges on, FP32's answers on them, a candidate's agreement with
them, and the verdict (a collapse, a missed target, or a figure) that ``edgert calibrate`` leads with."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgert.calib.dataset import CalibrationImages
from edgert.calib.options import COLLAPSE_FLOOR, CalibrationOptions
from edgert.calib.variants import VARIANTS, known_variants, variant_copies
from edgert.config import PipelineConfig
from edgert.errors import CalibrationError, ModelError

__all__ = ["accuracy", "check_frames", "reference", "verdict"]

log = logging.getLogger(__name__)

#: FP32's boxes of one class on the check set from which INT8 matching none of them is a collapse.
LOST_CLASS_BOXES = 10


def check_frames(images: str | Path, dataset: CalibrationImages, count: int, video: str | None,
                 video_count: int, held_out: bool = False,
                 variants: Sequence[str] = ("mirror", "half", "mosaic3")) -> tuple[list[np.ndarray], str]:
    """The frames the accuracy check and the sensitivity pass judge on, and a phrase saying what they are.

    Default: up to ``count`` of the calibration images plus, per name in ``variants``, one copy of each
    (:data:`~edgert.calib.variants.VARIANTS`): so the check never uses the images a user keeps apart to
    evaluate on (``edgert compare --skip-used``), and a layer is judged on scenes it did not get its ranges
    from (mirrored, objects move to the other side and asymmetric features change; smaller, a pixel of error
    is more IoU; nine to a frame, a crowd of small objects as a camera over a street or a hall sees it, which is
    where full INT8 loses most). ``held_out``: the folder's images calibration did not use instead (the
    calibration images when there are none). Plus ``video_count`` frames of ``video``. At most ``count``
    images are decoded, so the set is bounded whatever the number of calibration images.
    """
    known_variants(variants)
    if held_out:
        try:
            held = CalibrationImages(images, seed=1, exclude=frozenset(dataset.used), quiet=True)
            frames = [img for _, img in itertools.islice(held, count)]
            where = f"{len(frames)} images not used for calibration"
        except CalibrationError:
            again = CalibrationImages(images, seed=dataset.seed, quiet=True)
            frames = [img for _, img in itertools.islice(again, count)]
            where = f"{len(frames)} calibration images (the folder has no others)"
    else:
        again = CalibrationImages(images, seed=dataset.seed, exclude=frozenset(dataset.skipped), quiet=True)
        chosen = [img for _, img in itertools.islice(again, min(count, len(dataset.used)))]
        frames = list(chosen)
        for variant in variants:
            frames += list(variant_copies(chosen, variant))
        names = [VARIANTS[v] for v in variants]
        where = f"{len(chosen)} calibration images" + "".join(
            f"{', ' if i < len(names) - 1 else ' and '}{n}" for i, n in enumerate(names))
    if video:
        from edgert.calib.comparison import video_frames

        # halfway between the frames `edgert compare --video` takes: a check set disjoint from that one
        extra = [f for _, f in video_frames(video, video_count, offset=0.5)]
        frames += extra
        where += f" + {len(extra)} frames of {Path(video).name}"
    return frames, where


def reference(model: str | Path, frames: Sequence[np.ndarray], config: PipelineConfig) -> Any:
    """FP32's detections and outputs on the check frames, or None for a model no decoder knows."""
    from edgert.calib.comparison import detections_on

    try:
        return detections_on(model, frames, config)
    except ModelError:  # accuracy() says why
        return None


def accuracy(fp32: str | Path, candidate: Path, frames: Sequence[np.ndarray], config: PipelineConfig,
             reference_results: Any = None) -> dict[str, Any]:
    """``candidate``'s agreement with ``fp32`` on ``frames`` (:func:`~edgert.calib.comparison.compare_detectors`)."""
    from edgert.calib.comparison import compare_detectors

    try:
        return compare_detectors(fp32, candidate, ((str(i), f) for i, f in enumerate(frames)), config,
                                 reference_results=reference_results)
    except ModelError as exc:
        # Not a detector the decoders know: the raw output errors still say how close INT8 is.
        log.info("no detection decoder for this model (%s); comparing raw outputs", exc)
        return {"skipped": f"not a known detector: {exc}"}


def _lost_classes(acc: Mapping[str, Any] | None) -> list[str]:
    """Classes FP32 finds often on the check set (:data:`LOST_CLASS_BOXES` boxes or more) of which the INT8 model
    matches none (AP 0). A class seen once (and in its copies) that INT8 misses is a loss, not a collapse."""
    m = (acc or {}).get("map") or {}
    boxes = m.get("per_class_boxes") or {}
    return sorted(c for c, ap in (m.get("per_class") or {}).items()
                  if ap is not None and ap <= 0.0 and boxes.get(c, 0) >= LOST_CLASS_BOXES)


def verdict(acc: Mapping[str, Any] | None, opts: CalibrationOptions, mac_share: float,
            sensitivity: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What ``edgert calibrate`` leads with: the agreement with FP32, the INT8 share, and whether it failed.

    ``collapse`` is a calibration that broke the model (agreement below :data:`COLLAPSE_FLOOR`, or a class that
    FP32 finds and INT8 never does): a failure whatever was asked. ``met`` says whether mAP vs FP32 on the check
    set reached ``1 - max_drop`` (None without a target: ``--full-int8``, ``--no-check``, a model no decoder
    knows); ``failed`` is true for a collapse, and for a missed target only when the user set ``max_drop``
    (the default target is a figure to read, which INT8 on a MAC budget misses by a little on most detectors).
    """
    value = ((acc or {}).get("map") or {}).get("map50_95")
    out: dict[str, Any] = {"int8_mac_share": round(mac_share, 4), "min_int8_share": round(1.0 - opts.max_float, 4),
                           "map50_95": value, "collapse": False, "failed": False}
    lost = _lost_classes(acc)
    if value is not None and (value < COLLAPSE_FLOOR or lost):
        out.update(collapse=True, failed=True, why=(
            f"mAP@0.5:0.95 vs FP32 {value:.4f} < {COLLAPSE_FLOOR}: the INT8 model does not agree with FP32"
            if value < COLLAPSE_FLOOR else f"class(es) {', '.join(lost)} found by FP32 and never by INT8"))
    if opts.max_drop is None or value is None:
        why = ("full INT8 asked (no accuracy target)" if opts.max_drop is None else
               "accuracy not measured" + (f": {(acc or {}).get('skipped')}" if acc else " (--no-check)"))
        out.update(met=None, target=None)
        out.setdefault("why", why)
        return out
    target = 1.0 - opts.max_drop
    met = value >= target
    out.update(met=met, target=round(target, 4))
    if not met:
        out["failed"] = out["failed"] or opts.max_drop_given
        out.setdefault("why", f"mAP@0.5:0.95 vs FP32 {value:.4f} < {target:.4f} with the float layers the MAC "
                              f"budget allows ({100 * opts.max_float:.0f} % of MACs at most); raise --max-float "
                              "or --max-drop, or give --check-video with the deployment's footage")
    return out
