#!/usr/bin/env python3
"""Real-time factor of the VAD -> Whisper chain on this machine, and the share of audio Whisper ran on.

Usage: python scripts/bench_speech.py [--gap 3.0] [--threads 0] [--baseline] [--json OUT]

The input is the five LibriVox clips of the assets joined with ``--gap`` seconds of silence between
them (a dictation-like stream), written to a temporary WAV and read back through the file source. The
chain runs once; with ``--baseline`` Whisper also runs on the whole stream in 30 s windows without VAD,
in the same process, so the two are measured under the same load. RTF = busy seconds / audio seconds
(below 1 keeps up with a live microphone). The machine's load average is recorded with the figures: on
a shared machine, other work slows every number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _bench import assets_dir, machine_info

from edgert.config import ModelConfig, PipelineConfig, SourceConfig, SpeechConfig, VadConfig
from edgert.io.sinks import CallbackSink
from edgert.pipeline import Pipeline
from edgert.speech import read_audio, wer

SR = 16000


def main() -> int:
    assets = assets_dir()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=str(assets / "models/speech"))
    ap.add_argument("--audio", default=str(assets / "audio/librivox"))
    ap.add_argument("--gap", type=float, default=3.0, help="seconds of silence between clips")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--baseline", action="store_true", help="also run Whisper on everything, without VAD")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    models = Path(args.models)
    clips = sorted(Path(args.audio).glob("*.wav"))
    gap = np.zeros(int(args.gap * SR), dtype=np.float32)
    parts = [gap]
    for clip in clips:
        parts += [read_audio(clip), gap]
    stream = np.concatenate(parts)

    with tempfile.TemporaryDirectory() as tmp:
        import soundfile as sf

        wav = Path(tmp) / "stream.wav"
        sf.write(wav, stream, SR, subtype="PCM_16")
        texts: list[str] = []

        def collect(result: Any) -> None:
            texts.extend(str(e["text"]) for e in result.events if e["type"] == "transcript")

        def run(chain: tuple[str, ...]) -> dict[str, Any]:
            # The one pipeline, as `edgert run --task asr` runs it: the file source, the speech processor.
            config = PipelineConfig(
                task="asr", model=ModelConfig(path=str(models / "whisper-tiny.en"), backend="onnxruntime",
                                              threads=args.threads),
                source=SourceConfig(uri=str(wav)),
                speech=SpeechConfig(chain=chain, vad=VadConfig(model=str(models / "silero_vad.onnx"))))
            out: dict[str, Any] = Pipeline(config, sinks=[CallbackSink(collect, queue_size=4096)],
                                           handle_signals=False, environment=False).run()
            return out

        full = run(("vad", "asr"))
        summary = full["speech"]
        load_s = max(0.0, full.get("wall_s", 0.0) - summary["wall_seconds"])  # opening the models, and the rest
        baseline = None
        if args.baseline:
            got = len(texts)
            baseline = run(("asr",))["speech"]
            del texts[got:]

    refs = {}
    for line in (Path(args.audio) / "transcription").read_text().splitlines():
        if "(" in line:
            words, fid = line.rsplit("(", 1)
            refs[fid.strip(" )")] = words.replace("<s>", "").replace("</s>", "").strip()
    figures = {
        "machine": machine_info(),
        "backend": "onnxruntime (CPU)",
        "threads": args.threads,
        "stream_seconds": round(len(stream) / SR, 2),
        "clips": len(clips),
        "gap_seconds": args.gap,
        "model_load_seconds": round(load_s, 2),
        "rtf": summary["rtf"],
        "wall_rtf": summary["wall_rtf"],
        "whisper_share": summary["whisper_share"],
        "whisper_audio_seconds": summary["whisper_audio_seconds"],
        "segments": summary["segments"],
        "stages": summary["stages"],
        # One reference and one hypothesis for the whole stream: segments need not match clips one to one.
        "wer_of_chain": round(wer([" ".join(refs[c.stem] for c in clips)], [" ".join(texts)]), 4),
    }
    if baseline is not None:
        figures["baseline_without_vad"] = {"rtf": baseline["rtf"], "whisper_share": baseline["whisper_share"],
                                           "windows": baseline["stages"]["asr"]["calls"]}
        figures["speedup_from_vad"] = round(baseline["rtf"] / summary["rtf"], 2) if summary["rtf"] else None

    print(f"stream {figures['stream_seconds']} s ({len(clips)} clips, {args.gap} s gaps), load avg "
          f"{figures['machine']['loadavg'][0]:.1f} on {os.cpu_count()} CPUs")
    print(f"vad -> asr: RTF {summary['rtf']} (wall {summary['wall_rtf']}), Whisper ran on "
          f"{summary['whisper_audio_seconds']} s = {100 * summary['whisper_share']:.1f}% of the audio, "
          f"{summary['segments']} segments")
    for name, st in summary["stages"].items():
        print(f"  {name:<4} {st['calls']:5d} calls {st['seconds']:8.2f} s  rtf {st['rtf']}")
    print(f"WER of the chain's transcripts: {figures['wer_of_chain']}")
    if baseline is not None:
        print(f"without VAD: RTF {baseline['rtf']} over {baseline['stages']['asr']['calls']} 30 s windows "
              f"(VAD gating: {figures['speedup_from_vad']}x faster)")
    text = json.dumps(figures, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
