"""Calibration recipes: a YAML file that says how one model is calibrated.

    # calibration/yolov8s-fall.yaml
    images: ../shared/assets/images     # relative paths are relative to the recipe file
    num: 32
    seed: 0
    method: percentile
    percentile: 99.999
    pipeline: ../configs/fall.yaml      # optional: the pipeline config whose preprocess/decode apply
    preprocess: {pad_value: 114}        # optional: or the preprocess section inline
    max_drop: 0.05                      # optional: mixed precision target
    check_video: ../shared/assets/video/vtest.avi

Loaded with the same loader as pipeline configs, so a wrong key or value names its line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgert.config import FieldError, PreprocessConfig, load_config

__all__ = ["CalibrationRecipe", "load_recipe"]


@dataclass(frozen=True)
class CalibrationRecipe:
    images: str = ""
    num: int = 32
    seed: int = 0
    method: Literal["entropy", "percentile", "minmax", "mse"] = "percentile"
    percentile: float = 99.999
    pipeline: str | None = None  # a pipeline config (YAML) for preprocess and decode
    preprocess: PreprocessConfig | None = None  # or the preprocess section inline
    max_drop: float | None = None
    check_video: str | None = None
    check_frames: int = 40
    trt_version: str | None = None

    def __post_init__(self) -> None:
        if self.num < 0:
            raise FieldError("num", f"expected >= 0 (0: every image), got {self.num}")
        if not 0.0 < self.percentile <= 100.0:
            raise FieldError("percentile", f"expected a value in (0, 100], got {self.percentile}")
        if self.max_drop is not None and not 0.0 <= self.max_drop < 1.0:
            raise FieldError("max_drop", f"expected a value in [0, 1), got {self.max_drop}")
        if self.pipeline is not None and self.preprocess is not None:
            raise FieldError("preprocess", "give either pipeline (a config file) or preprocess (inline), not both")


def load_recipe(path: str | Path) -> CalibrationRecipe:
    """Load a recipe; relative paths in it are resolved against the recipe's folder."""
    recipe = load_config(path, CalibrationRecipe)
    base = Path(path).resolve().parent

    def resolve(p: str | None) -> str | None:
        if not p:
            return p
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else base / q)

    return CalibrationRecipe(
        images=resolve(recipe.images) or "", num=recipe.num, seed=recipe.seed, method=recipe.method,
        percentile=recipe.percentile, pipeline=resolve(recipe.pipeline), preprocess=recipe.preprocess,
        max_drop=recipe.max_drop, check_video=resolve(recipe.check_video), check_frames=recipe.check_frames,
        trt_version=recipe.trt_version,
    )
