"""What a calibration can be asked for, validated where it is built: :class:`CalibrationOptions`.

Every option here is one the measurements in calibration/README.md keep (a range method, the MAC budget of
the float layers, the check set, data-free equalisation, the weight-size term of the float ranking); the
options that were measured and did not pay (other weight roundings, bias correction, range search, image
variants in the range collection) are gone, so a user cannot pick them.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgert.calib.histograms import Method
from edgert.calib.qdq import DEFAULT_OPS
from edgert.calib.variants import known_variants
from edgert.errors import CalibrationError

__all__ = ["CHECK_FRAMES", "COLLAPSE_FLOOR", "DEFAULT_MAX_DROP", "EQUALIZATIONS", "CalibrationOptions",
           "ranges_method"]

#: Calibration images (each also mirrored, at half size and in 3x3 mosaics) for the check after calibrating.
CHECK_FRAMES = 16
#: Default mixed-precision target: layers go back to float until mAP vs FP32 on the check set >= 1 - this.
#: Full INT8 stays below 0.95 on both asset detectors with every range method (calibration/README.md).
DEFAULT_MAX_DROP = 0.01
#: Agreement with FP32 on the check set (mAP@0.5:0.95) below which a calibration has collapsed rather than lost
#: a little: a shared detector's INT8 agrees 0.85-0.95, a broken one (ModelOpt's held-out CenterNet: 0.10) not.
COLLAPSE_FLOOR = 0.10
#: ``equalization``: none, or rescaling by the weights' ranges (data-free cross-layer equalisation, the
#: default); ``activations`` rescales by the channels' ranges on the images (SmoothQuant's rule).
EQUALIZATIONS = ("none", "weights", "activations")


@dataclass(frozen=True)
class CalibrationOptions:
    num: int | None = 32
    method: Method = "percentile"  # measured best on both asset detectors (calibration/README.md)
    percentile: float = 99.999
    seed: int = 0
    ops: tuple[str, ...] = DEFAULT_OPS
    trt_version: str | None = None  # cache header; None: the installed TensorRT's (no cache without one)
    cache_algorithm: str = "EntropyCalibration2"
    max_drop: float | None = DEFAULT_MAX_DROP  # mixed precision until mAP >= 1 - max_drop (None: full INT8)
    #: whether the user asked for ``max_drop`` (a missed target is then a failure; the default's is a figure)
    max_drop_given: bool = False
    #: at most this fraction of the model's multiply-accumulates goes back to float (so >= 90 % stay INT8)
    max_float: float = 0.1
    check: bool = True  # measure accuracy against FP32 after calibrating
    check_frames: int = CHECK_FRAMES
    check_video: str | None = None  # also check (and run the sensitivity pass) on frames of this video
    check_video_frames: int = 40
    check_held_out: bool = False  # check on the folder's unused images instead of calibration images + copies
    #: copies of the check images added to the check set: "mirror", "half", "mosaic", "mosaic3". The 3x3
    #: mosaics (small objects, crowded frames) bring the check close to street and hall cameras: on held-out
    #: video frames 0.969 against 0.932 without them (calibration/README.md)
    check_variants: tuple[str, ...] = ("mirror", "half", "mosaic3")
    share_scales: tuple[str, ...] = ()  # ops whose inputs and outputs share one INT8 range (qdq.shared_ranges)
    score_frames: int = 8  # frames each layer's sensitivity is scored on
    budget_mb: float = 512.0  # exposed activations per ONNX Runtime run
    threads: int = 0
    exclude_nodes: tuple[str, ...] = ()
    force: bool = False
    engine_size: bool = False  # build the result with TensorRT-RTX (CPU is enough) and report the engine size
    #: weight bytes in the float-layer ranking (sensitivity.rank_candidates): cost = MAC share + this x weight
    #: share; 0 ranks by error per MAC alone. 1.0: YOLOv8s's engine 24.9 -> 20.3 MB (calibration/README.md)
    size_weight: float = 1.0
    #: equalisation (calib.equalize, :data:`EQUALIZATIONS`). "weights": held out +0.043 on YOLOv3-tiny and the
    #: video +0.034 on NanoDet over 13 calibration draws (calibration/README.md)
    equalization: str = "weights"
    equalize_alpha: float = 0.5  # SmoothQuant's alpha: 1 flattens the activations fully, 0 leaves them

    def __post_init__(self) -> None:
        if self.num is not None and self.num < 0:
            raise CalibrationError(f"num must be >= 0, got {self.num}")
        if not 0.0 < self.percentile <= 100.0:
            raise CalibrationError(f"percentile must be in (0, 100], got {self.percentile}")
        if self.max_drop is not None and not 0.0 <= self.max_drop < 1.0:
            raise CalibrationError(f"max_drop must be in [0, 1), got {self.max_drop}")
        if not 0.0 <= self.max_float <= 1.0:
            raise CalibrationError(f"max_float must be in [0, 1], got {self.max_float}")
        if self.size_weight < 0:
            raise CalibrationError(f"size_weight must be >= 0, got {self.size_weight}")
        if self.equalization not in EQUALIZATIONS:
            raise CalibrationError(f"unknown equalization {self.equalization!r}; known: {', '.join(EQUALIZATIONS)}")
        if not 0.0 <= self.equalize_alpha <= 1.0:
            raise CalibrationError(f"equalize_alpha must be in [0, 1], got {self.equalize_alpha}")
        known_variants(self.check_variants)


def ranges_method(opts: CalibrationOptions) -> str:
    return f"percentile {opts.percentile:g}" if opts.method == "percentile" else opts.method
