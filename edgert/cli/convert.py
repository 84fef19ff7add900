"""``edgert convert``: ONNX-to-ONNX precision rewrites (today FP32 to FP16).

The FP16 model keeps float32 inputs and outputs, and keeps in float32 the decoding tail and the ops
FP16 does not hold (softmax, exp, normalisations; see :mod:`edgert.rewrite.fp16`). It runs on ONNX
Runtime (CUDA; CPU too, slowly), and is what ``edgert build --precision fp16`` builds on TensorRT-RTX and
TensorRT 11, which take precision from the ONNX.

A Whisper folder (``encoder.onnx``, ``decoder.onnx``, ``tokenizer.json``) converts as a folder:
``edgert convert WHISPER_DIR -o OUT_DIR`` writes both ONNX files in FP16 and copies the tokenizer, so
OUT_DIR runs as it is (``edgert run --task asr --model OUT_DIR``); there is no decoding tail there (see
:mod:`edgert.speech.precision`). One file of the folder given alone converts as any model would, with
the detector's tail rule: that keeps the encoder's transformer float32, so convert the folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "convert", help="convert an FP32 ONNX model to FP16 (float32 inputs/outputs, sensitive ops float32)",
        description="Convert MODEL.onnx to FP16 ONNX. Inputs and outputs stay float32; the decoding tail "
                    "(after the last Conv) and softmax/exp/normalisations stay float32.")
    p.add_argument("model", help="the FP32 ONNX model, or a Whisper folder (encoder, decoder, tokenizer)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx",
                   help="FP16 model to write (for a Whisper folder: the output folder)")
    p.add_argument("--precision", choices=("fp16",), default="fp16", help="target precision (fp16)")
    p.add_argument("--convert-tail", action="store_true",
                   help="convert the decoding tail too (default: it stays float32)")
    p.add_argument("--keep-float", action="append", default=[], metavar="NODE", help="keep this node in float32")
    p.add_argument("--no-check", action="store_true",
                   help="skip running both models on one random input (ONNX Runtime CPU) to compare outputs")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgert._lazy import is_importable
    from edgert.atomic_file import refuse_replacing_input
    from edgert.cli.progress import Progress
    from edgert.rewrite.fp16 import convert_file, output_agreement
    from edgert.speech.precision import is_whisper_folder

    refuse_replacing_input(args.output, args.model)
    if is_whisper_folder(args.model):
        return _run_whisper(args)
    check = not args.no_check and is_importable("onnxruntime")
    progress = Progress(f"convert {Path(args.model).name}", 2 if check else 1, unit="step", quiet=args.json)
    with progress:
        progress.step("converting to FP16")
        result = convert_file(args.model, args.output, keep_tail=not args.convert_tail, fp32_nodes=args.keep_float)
        if check:
            progress.step("checking FP16 against FP32 on ONNX Runtime")
            try:
                result["check_max_rel_error"] = output_agreement(args.model, args.output)
            except Exception as exc:  # onnxruntime's pybind11 errors: the check takes dynamic dims as 1, which
                # a model may not run on (openWakeWord's melspectrogram needs more than one sample)
                from edgert.errors import first_line

                result["check_skipped"] = ("ONNX Runtime could not run the models on a random input: "
                                           f"{first_line(exc)}")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    why = ", ".join(f"{k}: {v}" for k, v in result["float32_why"].items()) or "none"
    print(f"wrote {result['output']} ({result['bytes'][1] / 1e6:.1f} MB, was {result['bytes'][0] / 1e6:.1f} MB): "
          f"{result['fp16_nodes']} nodes FP16, {result['float32_nodes']} float32 ({why}), "
          f"{result['casts_added']} casts added [{result['converter']}]")
    if "check_skipped" in result:
        print(f"check skipped: {result['check_skipped']}")
    for name, err in result.get("check_max_rel_error", {}).items():
        print(f"output {name}: max |FP16 - FP32| = {err:.2e} of its largest value (one random input, ORT CPU)")
    return 0


def _run_whisper(args: argparse.Namespace) -> int:
    from edgert.errors import ConfigError
    from edgert.speech.precision import convert_whisper_fp16

    if args.convert_tail or args.keep_float:
        raise ConfigError("--convert-tail and --keep-float are for one ONNX file, not a Whisper folder")
    result = convert_whisper_fp16(args.model, args.output, check=not args.no_check)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for entry in result["files"].values():
        if entry.get("copied"):
            print(f"copied {entry['output']}")
            continue
        why = ", ".join(f"{k}: {v}" for k, v in entry["float32_why"].items()) or "none"
        print(f"wrote {entry['output']} ({entry['bytes'][1] / 1e6:.1f} MB, was {entry['bytes'][0] / 1e6:.1f} MB): "
              f"{entry['fp16_nodes']} nodes FP16, {entry['float32_nodes']} float32 ({why}), "
              f"{entry['casts_added']} casts added")
        for out, err in entry.get("check_max_rel_error", {}).items():
            print(f"  output {out}: max |FP16 - FP32| = {err:.2e} of its largest value (one random input, ORT CPU)")
    print(f"[{result['converter']}]")
    return 0
