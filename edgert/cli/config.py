"""``edgert config FILE``: validate a pipeline YAML and print it with every default filled in.

A config whose model or source file is not there fails here, in one line naming each, not when a run starts.

Every string it prints goes through :func:`edgert.redact.redact`: the output is shown on screens, pasted into
issues and kept in shells' scroll-back, so a camera's or broker's password in a URI is shown as ``***`` (the
printed config is then not a loadable copy of a credentialed one; ``${VAR}`` credentials print as written).
"""

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


def _redacted(value: Any, redact: Any) -> Any:
    """``value`` with every string in it (keys too) passed through ``redact``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_redacted(k, redact): _redacted(v, redact) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v, redact) for v in value]
    return value


def missing_files(config: Any) -> list[str]:
    """``key: path`` for each file the config names that is not there: models (detection and speech) and
    sources that are local files or folders (not devices, camera numbers, globs or network URIs)."""
    from pathlib import Path

    from edgert.io.uri import local_file

    named = [("model.path", config.model.path), ("speech.vad.model", config.speech.vad.model),
             ("speech.asr.model", config.speech.asr.model)]
    named += [(f"speech.wakeword.models[{i}]", m) for i, m in enumerate(config.speech.wakeword.models)]
    for i, source in enumerate(config.all_sources()):
        path = local_file(source.uri) if source.uri else None
        if path and not path.isdigit() and not path.startswith("/dev/") and not any(c in path for c in "*?["):
            named.append(("source.uri" if not config.sources else f"sources[{i}].uri", path))
    return [f"{key} {path}" for key, path in named if path and not Path(path).exists()]


def run(args: argparse.Namespace) -> int:
    import yaml

    from edgert.config import load_config
    from edgert.errors import ConfigError
    from edgert.redact import redact

    config = load_config(args.file)
    missing = missing_files(config)
    if missing:  # a config that loads but cannot run is not a valid one
        raise ConfigError(f"{args.file}: not found: {', '.join(redact(m) for m in missing)}. Note: paths in a "
                          "config are relative to the config file")
    data = _redacted(dataclasses.asdict(config), redact)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        # tuples print as lists so the output is itself a loadable config
        print(yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False), end="")
    return 0
