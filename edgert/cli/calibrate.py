"""``edgert calibrate``: INT8 calibration from a folder of images.

Writes ``OUT.onnx`` (explicitly quantized, Q/DQ, for TensorRT 10+ and ONNX Runtime), ``OUT.calib`` (a
TensorRT calibration cache for implicit INT8 on JetPack 5/6 and DLA) and ``OUT.report.json``, and prints
the verdict and the INT8/float trade-off (the per-tensor table with ``-v``; every tensor is in the JSON report).
Outputs that are up to date (same model, images, preprocessing, method) are kept; anything else is rebuilt.

The model is written whatever the check says. The exit status is 4 when the calibration collapsed (agreement
with FP32 on the check set below 0.10, or a class FP32 finds and INT8 never does), 3 when a ``--max-drop``
the user gave is missed, else 0 (``--no-strict``: 0 always). The default target (0.01) is a figure to read: INT8
on a MAC budget misses it by a little on most detectors, which is no failure. ``--recipe`` reads the settings
from a YAML recipe (see calibration/); flags given on the command line win over the recipe.

A Whisper folder (``encoder.onnx``, ``decoder.onnx``, ``tokenizer.json``) calibrates on a folder of speech
clips instead: ``edgert calibrate WHISPER_DIR --audio CLIPS -o OUT_DIR`` writes OUT_DIR as a Whisper folder
with the encoder in Q/DQ INT8 (see :mod:`edgert.calib.whisper`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

METHODS = ("entropy", "percentile", "minmax", "mse")
#: Exit status when the model was written but mAP vs FP32 on the check set is below 1 - a --max-drop the user
#: gave (1 is an edgert error, 2 a usage error).
EXIT_TARGET_NOT_MET = 3
#: Exit status when the model was written but the calibration collapsed (:data:`edgert.calib.options.COLLAPSE_FLOOR`).
EXIT_COLLAPSE = 4


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate", help="INT8 calibration: Q/DQ ONNX + TensorRT calibration cache from a folder of images",
        description="Calibrate an FP32 ONNX detector for INT8 on a folder of images, or the encoder of a Whisper "
                    "folder on a folder of speech clips (--audio; -o is then a folder).",
    )
    p.add_argument("model", help="FP32 ONNX model, or a Whisper folder (with --audio)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx",
                   help="Q/DQ model to write; OUT.calib and OUT.report.json go beside it (for a Whisper folder: "
                        "the output folder)")
    p.add_argument("--recipe", metavar="RECIPE.yaml", help="calibration recipe (images, num, method, preprocessing)")
    p.add_argument("--images", metavar="DIR", help="folder of JPEG/PNG/BMP/WebP images (recursive)")
    p.add_argument("--audio", metavar="DIR",
                   help="Whisper: folder of speech clips (WAV/FLAC/...; recursive); -o is then the output folder")
    p.add_argument("--decoder-int8", action="store_true",
                   help="Whisper: the decoder in INT8 too (default: only the encoder; the decoder is copied)")
    p.add_argument("--num", type=int, help="images to draw from the folder (default 32; 0: all)")
    p.add_argument("--method", choices=METHODS,
                   help="range method: percentile (default), entropy (TensorRT's KL), minmax, "
                        "mse (least squared error)")
    p.add_argument("--percentile", type=float, help="for --method percentile (default 99.999)")
    p.add_argument("--seed", type=int, help="seed of the image draw (default 0)")
    p.add_argument("--config", metavar="pipeline.yaml", help="pipeline config whose preprocess/decode sections apply")
    p.add_argument("--max-drop", type=float, metavar="D",
                   help="mixed precision: keep the most sensitive layers float until mAP vs FP32 on the check set "
                        ">= 1-D (default 0.01)")
    p.add_argument("--full-int8", action="store_true",
                   help="no mixed precision: every layer that can be INT8 is (faster, less accurate)")
    p.add_argument("--max-float", type=float, default=0.1, metavar="F",
                   help="with --max-drop: at most this fraction of the model's multiply-accumulates goes back to "
                        "float (default 0.1: at least 90 %% stay INT8)")
    p.add_argument("--no-strict", dest="strict", action="store_false",
                   help="exit 0 even after a collapse (exit 4) or a missed --max-drop you gave (exit 3); the model "
                        "is written either way: the best found within --max-float")
    p.add_argument("--check-video", metavar="PATH", help="also check accuracy (and --max-drop) on frames of a video")
    p.add_argument("--check-frames", type=int, metavar="N", help="frames of --check-video (default 40)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the accuracy check against FP32 (and so the mixed-precision pass)")
    p.add_argument("--trt-version", metavar="X.Y.Z",
                   help="write OUT.calib (implicit INT8) for this TensorRT: 8.5.2 JetPack 5.1, 8.6.2 JetPack 6.0, "
                        "10.3.0 JetPack 6.2 (default: the installed TensorRT, where it has implicit INT8)")
    p.add_argument("--engine-size", action="store_true",
                   help="build the result with TensorRT-RTX (no GPU needed) and report the engine size")
    p.add_argument("--equalize", choices=("none", "weights"),
                   help="rescale each channel between two convs where only LeakyReLU/ReLU/MaxPool/Pad/Resize/"
                        "Concat lie between (exact in float), by the weights' ranges, so per-tensor INT8 ranges are "
                        "flatter (default: weights; none to compare)")
    p.add_argument("--size-weight", type=float, metavar="W",
                   help="rank float candidates by error per (MAC share + W x weight share), so layers with many "
                        "weights (a larger engine) go back last (0: by MACs alone; default: edgert.calib's)")
    p.add_argument("--exclude", action="append", default=[], metavar="NODE", help="keep this node in float")
    p.add_argument("--force", action="store_true", help="recalibrate even when the outputs are up to date")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.set_defaults(func=run)


def _pick(flag: Any, recipe_value: Any) -> Any:
    return recipe_value if flag is None else flag


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from edgert.atomic_file import refuse_replacing_input
    from edgert.calib.calibrate import DEFAULT_MAX_DROP, CalibrationOptions, calibrate
    from edgert.calib.recipe import CalibrationRecipe, load_recipe
    from edgert.calib.summary import format_table
    from edgert.config import PipelineConfig, load_config
    from edgert.errors import ConfigError

    refuse_replacing_input(args.output, args.model)
    if args.audio is not None or _is_whisper(args.model):
        return _run_whisper(args)
    if args.decoder_int8:
        raise ConfigError("--decoder-int8 is for a Whisper folder (calibrated on --audio)")
    recipe = load_recipe(args.recipe) if args.recipe else CalibrationRecipe()
    images = _pick(args.images, recipe.images or None)
    if not images:
        raise ConfigError("no image folder: give --images DIR (or images: in a --recipe)")
    num = _pick(args.num, recipe.num)
    max_drop = _pick(args.max_drop, recipe.max_drop)
    if args.full_int8:
        if args.max_drop is not None:
            raise ConfigError("--full-int8 and --max-drop contradict each other: give one")
        max_drop = None
    elif max_drop is None:
        max_drop = DEFAULT_MAX_DROP
    percentile = _pick(args.percentile, recipe.percentile)
    if num < 0:
        raise ConfigError(f"--num must be >= 0, got {num}")
    if max_drop is not None and not 0.0 <= max_drop < 1.0:
        raise ConfigError(f"--max-drop must be in [0, 1), got {max_drop}")
    if not 0.0 <= args.max_float <= 1.0:
        raise ConfigError(f"--max-float must be in [0, 1], got {args.max_float}")
    if args.size_weight is not None and args.size_weight < 0:
        raise ConfigError(f"--size-weight must be >= 0, got {args.size_weight}")
    if not 0.0 < percentile <= 100.0:
        raise ConfigError(f"--percentile must be in (0, 100], got {percentile}")
    pipeline = _pick(args.config, recipe.pipeline)
    config = load_config(pipeline) if pipeline else PipelineConfig()
    if recipe.preprocess is not None and args.config is None:
        config = dataclasses.replace(config, preprocess=recipe.preprocess)
    options = CalibrationOptions(
        num=num or None, method=_pick(args.method, recipe.method), percentile=percentile,
        seed=_pick(args.seed, recipe.seed),
        trt_version=_pick(args.trt_version, recipe.trt_version) or None,
        max_drop=max_drop, max_drop_given=args.max_drop is not None or recipe.max_drop is not None,
        max_float=args.max_float, check=not args.no_check,
        check_video=_pick(args.check_video, recipe.check_video),
        check_video_frames=_pick(args.check_frames, recipe.check_frames), exclude_nodes=tuple(args.exclude),
        force=args.force, engine_size=args.engine_size,
        **{k: v for k, v in (("size_weight", args.size_weight), ("equalization", args.equalize)) if v is not None},
    )
    report = calibrate(args.model, images, args.output, config, options, progress=sys.stderr.isatty())
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "table"}, indent=2, default=str))
    elif report.get("up_to_date"):
        print(f"{report['output']} is up to date (same model, images, preprocessing and method); --force to redo")
    else:
        print(format_table(report, tensors=args.verbose > 0))
    verdict = report.get("verdict") or {}
    if not verdict.get("failed") or not args.strict:
        return 0
    code = EXIT_COLLAPSE if verdict.get("collapse") else EXIT_TARGET_NOT_MET
    print(f"edgert calibrate: {'calibration collapsed' if verdict.get('collapse') else 'accuracy target not met'} "
          f"(exit {code}; --no-strict to exit 0)", file=sys.stderr)
    return code


def _is_whisper(model: str) -> bool:
    from edgert.speech.precision import is_whisper_folder

    return is_whisper_folder(model)


#: Flags of image calibration that mean nothing for a Whisper folder (value when not given).
_DETECTOR_ONLY = {"recipe": None, "images": None, "config": None, "max_drop": None, "full_int8": False,
                  "check_video": None, "check_frames": None, "trt_version": None, "force": False,
                  "max_float": 0.1, "strict": True, "engine_size": False}


def _run_whisper(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgert.calib.whisper import WhisperCalibrationOptions, calibrate_whisper
    from edgert.errors import ConfigError

    if not Path(args.model).is_dir():
        raise ConfigError(f"--audio calibrates a Whisper folder (encoder.onnx, decoder.onnx, tokenizer.json); "
                          f"{args.model} is not a folder. Note: a detector calibrates on --images")
    if args.audio is None:
        raise ConfigError(f"{args.model} is a Whisper folder: give --audio DIR, a folder of speech clips")
    given = [f"--{k.replace('_', '-')}" for k, unset in _DETECTOR_ONLY.items() if getattr(args, k) != unset]
    if given:
        raise ConfigError(f"{', '.join(given)}: image calibration only; not for a Whisper folder")
    if args.num is not None and args.num < 0:
        raise ConfigError(f"--num must be >= 0, got {args.num}")
    defaults = WhisperCalibrationOptions()
    percentile = defaults.percentile if args.percentile is None else args.percentile
    if not 0.0 < percentile <= 100.0:
        raise ConfigError(f"--percentile must be in (0, 100], got {percentile}")
    options = WhisperCalibrationOptions(
        num=defaults.num if args.num is None else (args.num or None), method=args.method or defaults.method,
        percentile=percentile, seed=defaults.seed if args.seed is None else args.seed, check=not args.no_check,
        exclude_nodes=tuple(args.exclude), decoder=args.decoder_int8)
    report = calibrate_whisper(args.model, args.audio, args.output, options, progress=sys.stderr.isatty())
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "table"}, indent=2, default=str))
    else:
        print(report["table"])
    return 0
