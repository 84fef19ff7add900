#!/usr/bin/env python3
"""Word error rate of Whisper (through edgert.speech) on the LibriVox clips of the assets.

Usage: python scripts/wer.py [--model DIR] [--audio DIR] [--backend NAME] [--json OUT]
Reads ``transcription`` (CMU Sphinx format: ``<s> words </s> (fileid)``), transcribes each WAV with
greedy decoding, prints per-clip lines and the corpus WER (lower case, punctuation stripped). With
``--vad`` the clips go through the VAD -> ASR chain instead of whole-clip transcription.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sys
import time
from pathlib import Path

from _bench import assets_dir

from edgert.speech import Transcriber, normalize_text, open_audio, wer, word_errors


def read_transcription(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\s*(?:<s>)?(.*?)(?:</s>)?\s*\(([^)]+)\)\s*$", line)
        if m:
            out[m.group(2)] = m.group(1).strip()
    return out


def main() -> int:
    assets = assets_dir()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(assets / "models/speech/whisper-tiny.en"))
    ap.add_argument("--audio", default=str(assets / "audio/librivox"))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--backend", default="onnxruntime",
                    help="onnxruntime (default), onnxruntime-cuda (the decoder then runs in fixed-shape buckets)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    audio_dir = Path(args.audio)
    refs = read_transcription(audio_dir / "transcription")
    clips = sorted(audio_dir.glob("*.wav"))
    if not clips:
        print(f"no WAV files in {audio_dir}", file=sys.stderr)
        return 1
    references, hypotheses, rows = [], [], []
    seconds: list[float] = []
    t_start = time.perf_counter()
    with Transcriber(args.model, backend=args.backend, threads=args.threads) as asr:
        for clip in clips:
            with open_audio(str(clip)) as src:
                audio = src.read_all()
            t0 = time.perf_counter()
            text = asr.transcribe(audio).text
            dt = time.perf_counter() - t0
            ref = refs.get(clip.stem, "")
            errors = word_errors(normalize_text(ref), normalize_text(text))
            print(f"{clip.name}: {errors}/{len(normalize_text(ref))} errors  rtf {dt / (len(audio) / 16000):.2f}")
            print(f"  ref: {ref}\n  hyp: {text}")
            references.append(ref)
            hypotheses.append(text)
            rows.append({"clip": clip.name, "reference": ref, "hypothesis": text, "errors": errors, "seconds": dt})
            seconds.append(dt)
    score = wer(references, hypotheses)
    words = sum(len(normalize_text(r)) for r in references)
    total = time.perf_counter() - t_start
    busy = sum(seconds)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(f"WER {score * 100:.2f}% over {len(clips)} clips, {words} words (target <= 10%)")
    print(f"time {total:.1f} s with model loading, {busy:.1f} s transcribing; peak RSS {peak_mb:.0f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"wer": score, "words": words, "model": args.model,
                                               "backend": args.backend, "seconds_total": total,
                                               "seconds_transcribing": busy, "peak_rss_mb": peak_mb,
                                               "clips": rows}, indent=2))
    return 0 if score <= 0.10 else 2


if __name__ == "__main__":
    sys.exit(main())
