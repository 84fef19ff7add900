#!/usr/bin/env python3
"""Held-out speech for Whisper: common sentences spoken by espeak-ng into a temporary folder.

Usage: python scripts/heldout_speech.py [--out DIR]   (prints the folder; WAVs plus a ``transcription``)

The clips are made at run time and never committed: ``scripts/wer.py --synth`` calls :func:`synthesize`
and scores them like the LibriVox clips. espeak-ng writes 22.05 kHz WAVs; the project's audio reader
resamples them to 16 kHz on read, as it does for any other rate. Two voices and two speaking rates, so
that the set is not one speaker at one speed; none of these sentences was looked at while tuning.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: (clip id, voice, words per minute, sentence). Ordinary sentences of everyday English.
SENTENCES: tuple[tuple[str, str, int, str], ...] = (
    ("synth01", "en-us", 150, "please turn off the lights in the kitchen"),
    ("synth02", "en-us", 150, "the weather will be sunny tomorrow afternoon"),
    ("synth03", "en", 140, "can you tell me where the nearest train station is"),
    ("synth04", "en", 140, "i would like a cup of coffee with milk"),
    ("synth05", "en-us", 170, "we are going to the park after lunch"),
    ("synth06", "en-us", 170, "my phone battery is almost empty"),
    ("synth07", "en", 160, "the meeting has been moved to next monday"),
    ("synth08", "en", 160, "set an alarm for seven o'clock in the morning"),
    ("synth09", "en-us", 140, "how much does this jacket cost"),
    ("synth10", "en-us", 140, "the children are playing football in the garden"),
    ("synth11", "en", 175, "she forgot her umbrella at the office"),
    ("synth12", "en", 175, "open the front door and let the dog out"),
    ("synth13", "en-us", 160, "there is a lot of traffic on the highway today"),
    ("synth14", "en-us", 160, "remind me to call my mother this evening"),
    ("synth15", "en", 150, "the library closes at nine on weekdays"),
    ("synth16", "en", 150, "he left his keys on the kitchen table"),
)


def espeak() -> str | None:
    """The espeak-ng (or espeak) program, or None when neither is installed."""
    return shutil.which("espeak-ng") or shutil.which("espeak")


def synthesize(folder: Path) -> Path:
    """Write one WAV per sentence and a CMU Sphinx ``transcription`` file into ``folder``; returns it."""
    exe = espeak()
    if exe is None:
        raise RuntimeError("espeak-ng is not installed (apt install espeak-ng)")
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for clip, voice, wpm, text in SENTENCES:
        subprocess.run([exe, "-v", voice, "-s", str(wpm), "-w", str(folder / f"{clip}.wav"), text],
                       check=True, capture_output=True)
        lines.append(f"<s> {text} </s> ({clip})")
    (folder / "transcription").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder to write into (default: a new temporary folder)")
    args = ap.parse_args()
    folder = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="edgert-heldout-"))
    try:
        print(synthesize(folder))
    except RuntimeError as exc:
        print(f"heldout_speech: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
