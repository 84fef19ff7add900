#!/usr/bin/env python3
"""Whisper tiny.en on ONNX Runtime CUDA with device buffers: RTF for greedy and beam 5 x FP32 / FP16 / INT8
encoder, watts, and WER on the shared clips.

Each run is :class:`edgert.speech.Transcriber` exactly as ``edgert run --task asr --backend onnxruntime-cuda``
opens it: the encoder and decoder sessions are edgert's ONNX Runtime CUDA sessions (inputs and outputs in
device buffers through IOBinding), and the decoder runs as the bucketed, fixed-shape graph (a preallocated
token window per bucket, no KV cache: the shape TensorRT builds), chosen with ``decoder="bucketed"``. The
encoder folders are made the way a user makes them (``edgert calibrate WHISPER --audio CARDS`` for INT8, the
encoder only; ``edgert convert WHISPER`` for FP16): :func:`bench_whisper_precision.folders`.

For every (precision, decoding) pair: one warm-up clip, then every clip of ``--audio`` (``--clips N``: the
first N) transcribed once; RTF = wall seconds / audio seconds over those clips; WER against the
``transcription`` file; watts = the NVML meter's average over the timed clips, and joules per audio second
(``null`` where no GPU meter reads, as on a CPU machine). The pairs are interleaved clip by clip, so a
machine whose load or clocks drift weighs on all alike.

On the device (the lead's command; kit from ../shared/gpu/README.md):

    python scripts/bench_whisper_gpu.py --backend onnxruntime-cuda --out whisper_gpu.json

On this CPU machine (a check that the script runs; the figures are CPU ones):

    python scripts/bench_whisper_gpu.py --backend onnxruntime --precisions fp32 --clips 1 --out /tmp/w.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import assets_dir, machine_info, write_json
from bench_whisper_precision import folders
from wer import read_transcription, transcription_file

ASSETS = assets_dir()
MODES: dict[str, dict[str, Any]] = {"greedy": {"decoding": "greedy"}, "beam5": {"decoding": "beam", "beam_size": 5}}


def _meter() -> Any:
    """A started NVML sampler, or None where no GPU meter reads (a CPU machine)."""
    from edgert.errors import EdgertError
    from edgert.power.meters import open_meter
    from edgert.power.sampler import PowerSampler

    try:
        meter = open_meter("nvml")
    except EdgertError as exc:
        print(f"no GPU power readings: {exc}", file=sys.stderr)
        return None
    return PowerSampler(meter, hz=20.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=ASSETS / "models/speech/whisper-tiny.en")
    ap.add_argument("--cards", type=Path, default=ASSETS / "audio/cards", help="INT8 calibration clips")
    ap.add_argument("--audio", type=Path, default=ASSETS / "audio/librivox", help="clips with references")
    ap.add_argument("--backend", default="onnxruntime-cuda", help="onnxruntime-cuda (the device), onnxruntime (CPU)")
    ap.add_argument("--precisions", default="fp32,fp16,int8", help="encoder precisions, comma-separated")
    ap.add_argument("--modes", default="greedy,beam5", help=f"decodings, comma-separated ({', '.join(MODES)})")
    ap.add_argument("--clips", type=int, default=0, help="only the first N clips (0: all)")
    ap.add_argument("--work", type=Path, help="folder for the FP16/INT8 folders (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=Path("bench_whisper_gpu.json"))
    args = ap.parse_args()

    from edgert.speech import Transcriber, normalize_text, read_audio, wer, word_errors

    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES] + [p for p in precisions if p not in ("fp32", "fp16", "int8")]
    if unknown:
        print(f"bench_whisper_gpu: unknown {', '.join(unknown)}", file=sys.stderr)
        return 1
    refs = read_transcription(transcription_file(args.audio))
    clips = sorted(args.audio.glob("*.wav"))[: args.clips or None]
    audio = {c: read_audio(c) for c in clips}
    seconds = sum(len(a) for a in audio.values()) / 16000
    work = args.work or Path(tempfile.mkdtemp(prefix="edgert-whisper-gpu-"))
    # fp32 (links), int8 (the encoder), int8+dec, fp16: made once, as a user makes them
    made = {"fp32": args.model} if precisions == ["fp32"] else folders(args.model, args.cards, work)

    runs: dict[str, Any] = {}
    asrs: dict[str, Any] = {}
    try:
        for p in precisions:
            for m in modes:
                key = f"{p}/{m}"
                decoder = "bucketed" if args.backend != "onnxruntime" else "auto"
                asrs[key] = Transcriber(made[p], backend=args.backend, decoder=decoder, **MODES[m])
                asrs[key].transcribe(audio[clips[0]])  # warm-up: allocator growth, cuDNN autotuning, buckets
                runs[key] = {"precision": p, "decoding": m, "seconds": 0.0, "hypotheses": [], "errors": 0,
                             "energy_j": 0.0, "watts": []}
        sampler = _meter()
        for clip in clips:  # interleaved: every pair on this clip, then the next clip
            for key, asr in asrs.items():
                r = runs[key]
                if sampler is not None:
                    sampler.start()
                t0 = time.perf_counter()
                text = asr.transcribe(audio[clip]).text
                dt = time.perf_counter() - t0
                if sampler is not None:
                    sampler.stop()
                    s = sampler.summary()
                    if s.get("avg_w") is not None:
                        r["watts"].append((float(s["avg_w"]), dt))
                        r["energy_j"] += float(s["avg_w"]) * dt
                r["seconds"] += dt
                r["hypotheses"].append(text)
                r["errors"] += word_errors(normalize_text(refs.get(clip.stem, "")), normalize_text(text))
            said = ", ".join(f"{k} {runs[k]['hypotheses'][-1]!r}" for k in runs)
            print(f"{clip.name}: {said}", flush=True)
    finally:
        for asr in asrs.values():
            asr.close()

    references = [refs.get(c.stem, "") for c in clips]
    table: dict[str, Any] = {}
    for key, r in runs.items():
        weighted = sum(w * t for w, t in r["watts"]) / sum(t for _, t in r["watts"]) if r["watts"] else None
        table[key] = {"precision": r["precision"], "decoding": r["decoding"], "rtf": round(r["seconds"] / seconds, 4),
                      "wer": round(wer(references, r["hypotheses"]), 4), "errors": r["errors"],
                      "watts": None if weighted is None else round(weighted, 2),
                      "joules_per_audio_s": round(r["energy_j"] / seconds, 4) if r["watts"] else None,
                      "hypotheses": r["hypotheses"]}
    result = {"machine": machine_info(), "backend": args.backend, "decoder": "bucketed (IOBinding device buffers)"
              if args.backend != "onnxruntime" else "exact (CPU)", "clips": [c.name for c in clips],
              "audio_seconds": round(seconds, 3), "results": table}
    print("\n| encoder | decoding | RTF | WER | watts | J per audio s |")
    print("|---|---|---|---|---|---|")
    for e in table.values():
        print(f"| {e['precision']} | {e['decoding']} | {e['rtf']} | {e['wer'] * 100:.2f} % | "
              f"{e['watts'] if e['watts'] is not None else '-'} | {e['joules_per_audio_s'] or '-'} |")
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
