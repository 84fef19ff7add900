#!/usr/bin/env python3
"""Whisper FP32 / INT8 / FP16 folders: WER on the LibriVox clips and encoder speed, on one backend.

Makes the folders the way a user does (``edgert calibrate WHISPER --audio cards``, with ``--decoder-int8``
for a second INT8 folder, and ``edgert convert WHISPER``), then for each folder:

1. WER against the references of ``--audio`` through :class:`edgert.speech.Transcriber` on ``--backend``
   (onnxruntime: the decoder runs exact; onnxruntime-cuda: fixed-shape decoder buckets);
2. encoder compute only (``--warmup`` then ``--iters`` runs on one log-mel, median ms), on ONNX Runtime
   (CPU or CUDA with I/O binding) and, with ``--tensorrt``, as an engine built by ``edgert build
   --backend tensorrt`` (strongly typed: precision from the ONNX), with its output's normalized MSE
   against FP32 ONNX Runtime on a real clip.

Prints a table and writes ``--out``. GPU use (Python 3.12, onnxruntime-gpu, TensorRT):

    python scripts/bench_whisper_precision.py --backend onnxruntime-cuda --tensorrt --out whisper_h200.json
    python scripts/bench_whisper_precision.py --iters 3 --warmup 1 --out /tmp/whisper_cpu.json    # CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _bench import assets_dir, machine_info, write_json
from wer import read_transcription

ASSETS = assets_dir()


def folders(src: Path, cards: Path, work: Path) -> dict[str, Path]:
    from edgert.calib.whisper import WhisperCalibrationOptions, calibrate_whisper
    from edgert.speech.precision import convert_whisper_fp16

    out = {"fp32": work / "fp32", "int8": work / "int8", "int8+dec": work / "int8-dec", "fp16": work / "fp16"}
    out["fp32"].mkdir(parents=True, exist_ok=True)
    for f in ("encoder.onnx", "decoder.onnx", "tokenizer.json"):  # links: engines are built beside the ONNX
        link = out["fp32"] / f
        if not link.exists():
            link.symlink_to((src / f).resolve())
    for name, decoder in (("int8", False), ("int8+dec", True)):
        if not (out[name] / "encoder.onnx").is_file():
            calibrate_whisper(src, cards, out[name], WhisperCalibrationOptions(check=False, decoder=decoder),
                              progress=False)
    if not (out["fp16"] / "encoder.onnx").is_file():
        convert_whisper_fp16(src, out["fp16"], check=False)
    return out


def word_error_rate(folder: Path, audio: Path, backend: str) -> dict[str, Any]:
    from edgert.speech import Transcriber, normalize_text, read_audio, wer

    refs = read_transcription(audio / "transcription")
    clips = sorted(audio.glob("*.wav"))
    hyps, busy = [], 0.0
    with Transcriber(folder, backend=backend) as asr:
        for clip in clips:
            x = read_audio(clip)
            t0 = time.perf_counter()
            hyps.append(asr.transcribe(x).text)
            busy += time.perf_counter() - t0
    references = [refs.get(c.stem, "") for c in clips]
    return {"wer": round(wer(references, hyps), 4), "words": sum(len(normalize_text(r)) for r in references),
            "seconds_transcribing": round(busy, 2), "hypotheses": hyps}


def _timed(once: Any, warmup: int, iters: int) -> dict[str, Any]:
    for _ in range(warmup):
        once()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return {"median_ms": round(1000 * statistics.median(times), 3), "iters": iters}


def ort_encoder(path: Path, mel: np.ndarray, cuda: bool, warmup: int, iters: int) -> dict[str, Any]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts,
                                providers=["CUDAExecutionProvider"] if cuda else ["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    if cuda:
        if "CUDAExecutionProvider" not in sess.get_providers():
            raise SystemExit(f"ONNX Runtime did not enable CUDA (providers {sess.get_providers()})")
        binding = sess.io_binding()
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(mel, "cuda", 0))
        for o in sess.get_outputs():
            binding.bind_output(o.name, "cuda", 0)

        def once() -> None:
            sess.run_with_iobinding(binding)
            binding.synchronize_outputs()
    else:
        def once() -> None:
            sess.run(None, {name: mel})
    return _timed(once, warmup, iters)


def trt_encoder(path: Path, mel: np.ndarray, reference: np.ndarray, warmup: int, iters: int) -> dict[str, Any]:
    from edgert.backends import open_session

    # strongly typed: each layer in the precision of its ONNX (float32, float16 or Q/DQ INT8), as on TensorRT-RTX
    build = subprocess.run([sys.executable, "-m", "edgert.cli.main", "build", str(path), "--backend", "tensorrt",
                            "--strongly-typed", "--no-progress"], capture_output=True, text=True)
    if build.returncode != 0:
        return {"error": (build.stderr.strip().splitlines() or ["build failed"])[-1]}
    with open_session(path, "tensorrt") as sess:
        name = sess.input_specs[0].name
        out_name = sess.output_specs[0].name
        got = np.asarray(sess.infer({name: mel})[out_name], np.float64)
        speed = _timed(lambda: sess.infer(), warmup, iters)
    nmse = float(np.mean((got - reference) ** 2) / np.mean(reference**2))
    return {**speed, "nmse_vs_fp32_ort": round(nmse, 6), "build": build.stdout.strip().splitlines()[-1:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=ASSETS / "models/speech/whisper-tiny.en")
    ap.add_argument("--cards", type=Path, default=ASSETS / "audio/cards", help="calibration clips")
    ap.add_argument("--audio", type=Path, default=ASSETS / "audio/librivox", help="clips with references")
    ap.add_argument("--backend", default="onnxruntime", help="for WER: onnxruntime or onnxruntime-cuda")
    ap.add_argument("--tensorrt", action="store_true", help="also build and time the encoders with TensorRT")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--work", type=Path, help="folder for the INT8/FP16 folders (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=Path("bench_whisper_precision.json"))
    args = ap.parse_args()

    import onnxruntime as ort

    from edgert.speech import WhisperFeatures, read_audio

    work = args.work or Path(tempfile.mkdtemp(prefix="edgert-whisper-"))
    models = folders(args.model, args.cards, work)
    clip = sorted(args.audio.glob("*.wav"))[0]
    mel = WhisperFeatures()(read_audio(clip))
    cuda = args.backend == "onnxruntime-cuda"
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    ref_sess = ort.InferenceSession(str(args.model / "encoder.onnx"), opts, providers=["CPUExecutionProvider"])
    reference = np.asarray(ref_sess.run(None, {"mel": mel})[0], np.float64)
    result: dict[str, Any] = {"machine": machine_info(), "backend": args.backend, "onnxruntime": ort.__version__,
                              "folders": {k: str(v) for k, v in models.items()}, "results": {}}
    for name, folder in models.items():
        entry: dict[str, Any] = {"wer": word_error_rate(folder, args.audio, args.backend)}
        entry["encoder_ort"] = ort_encoder(folder / "encoder.onnx", mel, cuda, args.warmup, args.iters)
        if args.tensorrt:
            entry["encoder_tensorrt"] = trt_encoder(folder / "encoder.onnx", mel, reference, args.warmup, args.iters)
        result["results"][name] = entry
        print(f"{name}: WER {entry['wer']['wer'] * 100:.2f}% ({entry['wer']['seconds_transcribing']} s), encoder "
              f"{entry['encoder_ort']['median_ms']} ms ORT"
              + (f", TensorRT {entry['encoder_tensorrt']}" if args.tensorrt else ""), flush=True)
    print(f"\n| folder | WER ({args.backend}) | transcribing s | encoder ms (ORT) | encoder ms (TensorRT) | "
          "TensorRT encoder NMSE |")
    print("|---|---|---|---|---|---|")
    for name, e in result["results"].items():
        trt = e.get("encoder_tensorrt") or {}
        print(f"| {name} | {e['wer']['wer'] * 100:.2f} % | {e['wer']['seconds_transcribing']} | "
              f"{e['encoder_ort']['median_ms']} | {trt.get('median_ms', trt.get('error', '-'))} | "
              f"{trt.get('nmse_vs_fp32_ort', '-')} |")
    write_json(args.out, json.loads(json.dumps(result, default=str)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
