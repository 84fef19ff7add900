"""``edgert inspect MODEL``: a model's inputs, outputs and metadata, as the chosen backend sees them."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("inspect", help="show a model's inputs, outputs and metadata")
    p.add_argument("model", help="ONNX model (or engine, on TensorRT backends)")
    p.add_argument("--backend", default="auto", help="backend to load it with (default: auto)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _decoder_line(specs: Any, metadata: dict[str, str]) -> str:
    """Which detection decoder ``decode.kind: auto`` picks for these outputs, or why none fits."""
    from edgert.config import DecodeConfig
    from edgert.errors import ModelError
    from edgert.vision.decoders import make_decoder

    try:
        decoder = make_decoder(DecodeConfig(), specs, metadata)
    except ModelError as exc:
        return f"none: {exc}"
    return f"{decoder.kind} ({len(decoder.names)} classes)" if decoder.names else decoder.kind


def run(args: argparse.Namespace) -> int:
    from edgert.backends import open_session

    with open_session(args.model, args.backend) as session:
        info = session.describe()
        info["metadata"] = session.metadata
        info["decoder"] = _decoder_line(session.output_specs, dict(session.metadata))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"backend   {info['backend']}")
    for kind in ("inputs", "outputs"):
        for i, spec in enumerate(info[kind]):
            print(f"{kind if i == 0 else '':<9} {spec}")
    for key, value in info["metadata"].items():
        print(f"meta      {key}: {value}")
    print(f"decoder   {info['decoder']}")
    return 0
