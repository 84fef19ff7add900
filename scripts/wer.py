#!/usr/bin/env python3
"""Word error rate of Whisper (through edgert.speech) on the LibriVox clips of the assets.

Usage: python scripts/wer.py [--model DIR] [--audio DIR] [--backend NAME] [--json OUT]
       [--beam] [--fallback] [--compare] [--synth]
Reads ``transcription`` (CMU Sphinx format: ``<s> words </s> (fileid)``; ``*.transcription`` when the folder
has no ``transcription``), transcribes each WAV with greedy decoding, prints per-clip lines and the corpus WER
after Whisper's English normalizer (``--normalizer whisper``, the default, as published Whisper WERs; the basic
lower-case-and-strip-punctuation WER is reported beside it: edgert.speech.wer).
``--beam`` uses openai-whisper's beam search (``--beam-size``, 5),
``--fallback`` its temperature fallback (0.0, 0.2 ... 1.0); ``--compare`` runs greedy and beam, each without
and with the fallback, on the same clips (interleaved clip by clip, so a loaded machine weighs on all alike)
and reports each one's WER and real-time factor (wall seconds, and CPU seconds of all threads, per second
of audio: the CPU figure moves less when other work shares the machine). ``--synth`` scores the held-out sentences of
``scripts/heldout_speech.py``, spoken by espeak-ng into a temporary folder, instead of ``--audio``.
``--check-default --modes auto,...`` runs the held-out sentences, then ``--audio``, in one process and prints, per
mode, the held-out WER, the shared WER, the shared clips' wall RTF with the 1-minute load average sampled at
each clip, and the CPU RTF (all threads, and per thread: ONNX Runtime's intra-op threads, ``--threads`` or one per
physical core); ``auto`` is the default decoding of ``edgert run`` (edgert.search_rules.auto_decoding).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import assets_dir, machine_info
from heldout_speech import synthesize

from edgert.backends import gpu_backends
from edgert.search_rules import auto_decoding
from edgert.speech import Transcriber, normalize_text, read_audio, wer, word_errors
from edgert.speech.decoding import FALLBACK_TEMPERATURES

#: name -> (decoding, temperatures)
MODES: dict[str, tuple[str, tuple[float, ...]]] = {
    "greedy": ("greedy", (0.0,)),
    "beam": ("beam", (0.0,)),
    "greedy+fallback": ("greedy", FALLBACK_TEMPERATURES),
    "beam+fallback": ("beam", FALLBACK_TEMPERATURES),
    "greedy>beam": ("greedy", (0.0,)),  # beam only for windows greedy fails the fallback checks on
    "beam2": ("beam", (0.0,)),  # narrower beams (the size is in the name)
    "beam3": ("beam", (0.0,)),
    "beam5": ("beam", (0.0,)),
    "auto": ("auto", (0.0,)),  # what edgert run does by default: the device's choice (edgert.search_rules)
}


def _physical_cores() -> int:
    """Physical cores (distinct core ids of /proc/cpuinfo), else os.cpu_count()."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.cpu_count() or 1
    cores = set(re.findall(r"physical id\s*:\s*(\d+)[\s\S]*?core id\s*:\s*(\d+)", text))
    return len(cores) or os.cpu_count() or 1


def read_transcription(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\s*(?:<s>)?(.*?)(?:</s>)?\s*\(([^)]+)\)\s*$", line)
        if m:
            out[m.group(2)] = m.group(1).strip()
    return out


def transcription_file(folder: Path) -> Path:
    plain = folder / "transcription"
    return plain if plain.is_file() else next(iter(sorted(folder.glob("*.transcription"))), plain)


def main() -> int:
    assets = assets_dir()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(assets / "models/speech/whisper-tiny.en"))
    ap.add_argument("--audio", default=str(assets / "audio/librivox"))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--backend", default="onnxruntime",
                    help="onnxruntime (default), onnxruntime-cuda (the decoder then runs in fixed-shape buckets)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--normalizer", choices=("whisper", "basic"), default="whisper",
                    help="text normalizer: Whisper's English one (default, as published WERs) or basic; "
                         "the other's WER is reported beside it")
    ap.add_argument("--beam", action="store_true", help="beam search instead of greedy decoding")
    ap.add_argument("--beam-size", type=int, default=5, help="beams with --beam or --compare (5)")
    ap.add_argument("--fallback", action="store_true", help="temperature fallback (0.0, 0.2 ... 1.0)")
    ap.add_argument("--compare", action="store_true",
                    help="greedy, beam, greedy+fallback and beam+fallback on the same clips")
    ap.add_argument("--modes", help=f"comma-separated modes to run side by side ({', '.join(MODES)})")
    ap.add_argument("--synth", action="store_true",
                    help="held-out sentences spoken by espeak-ng (scripts/heldout_speech.py) instead of --audio")
    ap.add_argument("--check-default", action="store_true",
                    help="one run for the default's two targets: WER on the held-out sentences (<= 10 %%) and wall "
                         "RTF on --audio (< 1), each mode of --modes on both; exit 0 when the first mode meets both")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="edgert-heldout-") as tmp:
        if args.check_default:
            try:
                heldout = synthesize(Path(tmp))
            except RuntimeError as exc:
                print(f"wer: {exc}", file=sys.stderr)
                return 1
            out = args.json
            args.json, args.synth = (f"{out}.heldout.json" if out else None), True
            score(args, heldout)
            held = args.figures
            args.json, args.synth = (f"{out}.shared.json" if out else None), False
            score(args, Path(args.audio))
            shared = args.figures
            ok = True
            for mode in held["modes"]:
                w, r = held["modes"][mode]["wer"], shared["modes"][mode]["rtf"]
                c, ct = shared["modes"][mode]["cpu_rtf"], shared["modes"][mode]["cpu_rtf_per_thread"]
                print(f"default check {mode:<14} held-out WER {w * 100:.2f}% ({'ok' if w <= 0.10 else 'over 10%'}), "
                      f"shared WER {shared['modes'][mode]['wer'] * 100:.2f}%, shared clips wall RTF {r:.3f} "
                      f"({'ok' if r < 1 else 'over 1'}) at load avg {shared['loadavg_1min_mean']:.1f} "
                      f"({shared['loadavg_1min_range'][0]:.1f}-{shared['loadavg_1min_range'][1]:.1f}); CPU RTF "
                      f"{c:.3f} = {ct:.3f} per thread x {shared['threads']}")
                ok = ok and (mode != next(iter(held["modes"])) or (w <= 0.10 and r < 1))
            return 0 if ok else 2
        if args.synth:
            try:
                audio_dir = synthesize(Path(tmp))
            except RuntimeError as exc:
                print(f"wer: {exc}", file=sys.stderr)
                return 1
        else:
            audio_dir = Path(args.audio)
        return score(args, audio_dir)


def score(args: argparse.Namespace, audio_dir: Path) -> int:
    refs = read_transcription(transcription_file(audio_dir))
    clips = sorted(audio_dir.glob("*.wav"))
    if not clips:
        print(f"no WAV files in {audio_dir}", file=sys.stderr)
        return 1
    if args.modes:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in MODES]
        if unknown:
            print(f"wer: unknown mode {', '.join(unknown)} (modes: {', '.join(MODES)})", file=sys.stderr)
            return 1
    elif args.compare:
        modes = list(MODES)
    else:
        modes = [("beam" if args.beam else "greedy") + ("+fallback" if args.fallback else "")]
    results: dict[str, dict[str, Any]] = {m: {"hypotheses": [], "seconds": 0.0, "cpu_seconds": 0.0, "clips": []}
                                     for m in modes}
    references: list[str] = []
    loads: list[float] = []  # the 1-minute load average at each clip: what the wall figures shared the box with
    audio_seconds = 0.0
    t_start = time.perf_counter()
    with Transcriber(args.model, backend=args.backend, threads=args.threads, beam_size=args.beam_size) as asr:
        for clip in clips:
            audio = read_audio(clip)
            ref = refs.get(clip.stem, "")
            references.append(ref)
            audio_seconds += len(audio) / 16000
            loads.append(os.getloadavg()[0])
            print(f"{clip.name}  ref: {ref}")
            for mode in modes:
                asr.decoding, asr.temperatures = MODES[mode]  # type: ignore[assignment]
                asr.beam_rescue = mode == "greedy>beam"
                asr.beam_size = int(mode[4:]) if mode[4:].isdigit() else args.beam_size
                if mode == "auto":
                    asr.decoding, asr.beam_size = auto_decoding(asr.encoder.backend_name in gpu_backends())  # type: ignore[assignment]
                before = asr.stats["fallback_windows"]
                c0, t0 = time.process_time(), time.perf_counter()
                text = asr.transcribe(audio).text
                dt, cpu = time.perf_counter() - t0, time.process_time() - c0
                errors = word_errors(normalize_text(ref, args.normalizer), normalize_text(text, args.normalizer))
                r = results[mode]
                r["hypotheses"].append(text)
                r["seconds"] += dt
                r["cpu_seconds"] += cpu
                r["clips"].append({"clip": clip.name, "reference": ref, "hypothesis": text, "errors": errors,
                                   "seconds": round(dt, 3), "cpu_seconds": round(cpu, 3),
                                   "fell_back": asr.stats["fallback_windows"] > before})
                print(f"  {mode:<16} {errors}/{len(normalize_text(ref, args.normalizer))} errors  "
                      f"rtf {dt / (len(audio) / 16000):.2f}  hyp: {text}")
    words = sum(len(normalize_text(r, args.normalizer)) for r in references)
    total = time.perf_counter() - t_start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(f"time {total:.1f} s with model loading; peak RSS {peak_mb:.0f} MiB")
    # ONNX Runtime's intra-op threads: --threads, or its default, one per physical core (os.cpu_count() counts
    # logical ones; on a box without SMT they agree). CPU RTF per thread = process CPU s / audio s / threads.
    threads = args.threads or _physical_cores()
    summary: dict[str, Any] = {"audio": str(audio_dir) if not args.synth else "espeak-ng held-out sentences",
                               "threads": threads, "loadavg_1min_mean": round(sum(loads) / len(loads), 2),
                               "loadavg_1min_range": [round(min(loads), 2), round(max(loads), 2)],
                               "n_clips": len(clips), "words": words, "audio_seconds": round(audio_seconds, 3),
                               "beam_size": args.beam_size, "model": args.model, "backend": args.backend,
                               "seconds_total": round(total, 3), "peak_rss_mb": round(peak_mb, 1),
                               "normalizer": args.normalizer, "modes": {}}
    other = "basic" if args.normalizer == "whisper" else "whisper"
    for mode in modes:
        r = results[mode]
        s = wer(references, r["hypotheses"], args.normalizer)
        s_other = wer(references, r["hypotheses"], other)
        summary["modes"][mode] = {"wer": round(s, 4), f"wer_{other}": round(s_other, 4),
                                  "errors": sum(c["errors"] for c in r["clips"]),
                                  "rtf": round(r["seconds"] / audio_seconds, 4),
                                  "cpu_rtf": round(r["cpu_seconds"] / audio_seconds, 4),
                                  "cpu_rtf_per_thread": round(r["cpu_seconds"] / audio_seconds / threads, 4),
                                  "fallback_clips": sum(c["fell_back"] for c in r["clips"]), "clips": r["clips"]}
        print(f"{mode:<16} WER {s * 100:.2f}% ({args.normalizer}; {other} {s_other * 100:.2f}%) over {len(clips)} "
              f"clips, {words} words (target <= 10%)  "
              f"rtf {r['seconds'] / audio_seconds:.3f} (cpu {r['cpu_seconds'] / audio_seconds:.3f})")
    args.figures = summary
    first_mode = summary["modes"][modes[0]]
    summary.update(wer=first_mode["wer"], clips=first_mode["clips"])  # the figures of one mode, as before
    if args.json:
        summary["machine"] = machine_info()
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if first_mode["wer"] <= 0.10 else 2


if __name__ == "__main__":
    sys.exit(main())
