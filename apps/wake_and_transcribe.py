#!/usr/bin/env python3
"""Say a wake word, then speak: the words after it are transcribed. Public edgert API only.

    python apps/wake_and_transcribe.py --models ../shared/assets/models/speech --source alsa://default
    python apps/wake_and_transcribe.py --models ../shared/assets/models/speech --source recording.wav

Silero VAD finds speech, openWakeWord listens inside it for the wake word ("hey jarvis" by default),
and Whisper tiny.en transcribes the speech that holds or follows the wake word within --listen seconds.
Events are printed as they happen; a summary (real-time factor, share of audio Whisper ran on) at the
end. Ctrl-C stops a microphone.

The pretrained openWakeWord word models are CC BY-NC-SA 4.0 (non-commercial): fine for a demo, not
for a product; train your own word for that.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from edgert import EdgertError
from edgert.config import ModelConfig, PipelineConfig, SourceConfig, SpeechConfig, VadConfig, WakeWordConfig
from edgert.io.sinks import CallbackSink, FrameResult
from edgert.pipeline import Pipeline


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, type=Path,
                    help="folder with silero_vad.onnx, openwakeword/ and whisper-tiny.en/")
    ap.add_argument("--source", default="alsa://default", help="alsa://DEVICE, mic://N, a WAV/FLAC file or folder")
    ap.add_argument("--word", default="hey_jarvis_v0.1.onnx", help="wake-word classifier in MODELS/openwakeword")
    ap.add_argument("--threshold", type=float, default=0.5, help="wake-word score that fires")
    ap.add_argument("--listen", type=float, default=8.0, help="seconds after the wake word that are transcribed")
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def show(result: FrameResult) -> None:  # a chunk's events, on the sink's thread, in order
        for event in result.events:
            if event["type"] == "wake":
                print(f"[{event['time']:7.2f}s] wake word {event['word']} ({event['score']:.2f})", flush=True)
            elif event["type"] == "transcript":
                print(f"[{event['start']:7.2f}s - {event['end']:7.2f}s] {event['text']}", flush=True)

    # The same Pipeline as `edgert run --task asr` with a vad -> wakeword -> asr chain: signals, sinks, summary.
    speech = SpeechConfig(chain=("vad", "wakeword", "asr"), vad=VadConfig(model=str(args.models / "silero_vad.onnx")),
                          wakeword=WakeWordConfig(models=(str(args.models / "openwakeword" / args.word),),
                                                  threshold=args.threshold, listen_s=args.listen))
    config = PipelineConfig(task="asr", model=ModelConfig(path=str(args.models / "whisper-tiny.en"),
                                                          backend=args.backend),
                            source=SourceConfig(uri=args.source), speech=speech)
    try:
        print(f"listening to {args.source} for {args.word.split('_v')[0]} (Ctrl-C stops)", file=sys.stderr)
        summary = Pipeline(config, sinks=[CallbackSink(show, queue_size=1024)]).run()["speech"]
    except EdgertError as exc:
        print(f"wake_and_transcribe: error: {exc}", file=sys.stderr)
        return 1
    print(f"{summary['audio_seconds']} s of audio, RTF {summary['rtf']}, Whisper ran on "
          f"{100 * summary['whisper_share']:.1f}% of it, {summary['wake_events']} wake words, "
          f"{summary['transcripts']} transcripts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
