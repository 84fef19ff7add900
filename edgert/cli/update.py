"""``edgert update``: hand a running pipeline a new model, or take the previous one back.

The model goes into the run's ``model.update_dir`` (found through the service's unit and config with
``--service NAME``, or given with ``--dir``): its settings first (``MODEL.onnx.json``), then the model under a
hidden name, renamed into place, so the running pipeline never takes half a file. The pipeline builds it in the
background, checks it on its own recent frames and swaps it in, or says why not (``journalctl -u edgert-NAME``,
``/metrics``, the run's summary). ``--rollback`` makes the previous model current again, running or not.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("update", help="give a running pipeline a new model (built, checked, swapped in the "
                              "background) or roll back", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--service", metavar="NAME", help="the service (edgert service install --name NAME)")
    where.add_argument("--dir", metavar="DIR", help="the run's model.update_dir")
    p.add_argument("model", nargs="?", help="the new model (ONNX)")
    p.add_argument("--precision", choices=("fp32", "int8"), default="fp32",
                   help="int8: calibrated on the device (on --images, else on the run's own recent frames)")
    p.add_argument("--images", metavar="DIR", help="calibration images for --precision int8")
    p.add_argument("--reference", metavar="FP32.onnx",
                   help="the FP32 model a quantized MODEL is checked against (default: MODEL itself)")
    p.add_argument("--rollback", action="store_true", help="make the previous model current again")
    p.add_argument("--status", action="store_true", help="print the update state (state.json) and exit")
    p.add_argument("--unit-dir", default="/etc/systemd/system", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def service_update_dir(name: str, unit_dir: str | Path = "/etc/systemd/system") -> Path:
    """The ``model.update_dir`` of service ``name``: its unit's ``--config``, that config's key."""
    from edgert.config import load_config
    from edgert.errors import ConfigError
    from edgert.service.unit import unit_name

    unit = Path(unit_dir) / unit_name(name)
    try:
        text = unit.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"service {name!r}: {unit} unreadable ({exc.strerror or exc}). Note: install it with "
                          "edgert service install, or give --dir") from None
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            argv = shlex.split(line[len("ExecStart="):])
            if "--config" in argv[:-1]:
                config = load_config(argv[argv.index("--config") + 1])
                if not config.model.update_dir:
                    raise ConfigError(f"service {name!r}: its config has no model.update_dir. Note: set one "
                                      "(an absolute folder) and restart the service")
                return Path(config.model.update_dir)
    raise ConfigError(f"service {name!r}: {unit} has no ExecStart with --config")


def drop_model(update_dir: Path, model: Path, settings: dict[str, Any]) -> Path:
    """``model`` into ``update_dir`` as the running pipeline takes it: settings first, then the model renamed
    into place from a hidden name. Returns where it lies."""
    import shutil

    from edgert.atomic_file import write_atomic
    from edgert.errors import ConfigError

    if not model.is_file():
        raise ConfigError(f"{model}: no such model file")
    update_dir.mkdir(parents=True, exist_ok=True)
    target = update_dir / model.name
    if settings:
        write_atomic(Path(f"{target}.json"), json.dumps(settings))
    hidden = update_dir / f".{model.name}.partial"
    shutil.copyfile(model, hidden)
    hidden.replace(target)
    return target


def run(args: argparse.Namespace) -> int:
    from edgert.errors import ConfigError
    from edgert.pipeline.update_state import read_state, request_rollback

    update_dir = service_update_dir(args.service, args.unit_dir) if args.service else Path(args.dir)
    if args.status:
        print(json.dumps(read_state(update_dir), indent=1, sort_keys=True))
        return 0
    if args.rollback:
        if args.model:
            raise ConfigError("--rollback takes no model")
        previous = request_rollback(update_dir)
        print(f"rolled back to {previous.get('label') or previous.get('path')} "
              "(a running pipeline swaps at once; a start takes it)")
        return 0
    if not args.model:
        raise ConfigError("no model given. Note: edgert update --service NAME MODEL.onnx, or --rollback")
    if args.images and args.precision != "int8":
        raise ConfigError("--images is for --precision int8")
    settings: dict[str, Any] = {}
    if args.precision == "int8":
        settings["precision"] = "int8"
    if args.images:
        settings["images"] = str(Path(args.images).resolve())
    if args.reference:
        settings["reference"] = str(Path(args.reference).resolve())
    target = drop_model(update_dir, Path(args.model), settings)
    print(f"queued {target} (the pipeline builds, checks and swaps it in the background)")
    return 0
