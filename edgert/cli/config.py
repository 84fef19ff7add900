"""``edgert config FILE``: validate a pipeline YAML and print it with every default filled in."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("config", help="validate a pipeline YAML and show the resolved configuration")
    p.add_argument("file", help="pipeline YAML")
    p.add_argument("--json", action="store_true", help="print JSON (default: YAML)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from edgert.config import load_config

    config = load_config(args.file)
    data = dataclasses.asdict(config)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        # tuples print as lists so the output is itself a loadable config
        print(yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False), end="")
    return 0
