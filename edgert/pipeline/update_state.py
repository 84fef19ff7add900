"""What a device remembers about its model updates: ``<model.update_dir>/state.json``.

The state file is what makes an update survive a restart and a bad one undo itself after a crash loop:

- ``current``: the model the run uses now (a swapped-in candidate, kept under ``models/``), ``previous``: the one
  before it, kept too, for ``edgert update --rollback`` and the automatic rollbacks;
- ``probation``: set at a swap, cleared once the new model has run ``model.update_probation_s`` seconds without an
  error or a slowdown, or at a clean stop. Each start of the run during probation counts; at
  :data:`CRASH_STARTS` starts the model never lived through, the next start comes back on ``previous``
  (:func:`start_config`, which the pipeline calls before it opens the model, so the service unit's restarts
  do this with nothing of their own).

Every write replaces the file atomically, so a crash while writing leaves the last whole state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from edgert.atomic_file import write_atomic
from edgert.config import PipelineConfig

__all__ = ["CRASH_STARTS", "STATE_FILE", "read_state", "record_swap", "request_rollback", "settle", "start_config",
           "write_state"]

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
#: starts on a model still on probation after which the next start takes the previous model (a crash loop)
CRASH_STARTS = 3


def read_state(update_dir: str | Path) -> dict[str, Any]:
    """The state of ``update_dir`` ({} when there is none or it is unreadable: the config's model then)."""
    path = Path(update_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("model update: %s unreadable (%s); starting on the configured model", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def write_state(update_dir: str | Path, state: dict[str, Any]) -> None:
    Path(update_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(update_dir) / STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def _model(path: str, label: str) -> dict[str, Any]:
    return {"path": str(path), "label": label, "since": round(time.time(), 3)}


def record_swap(update_dir: str | Path, new_path: str, label: str, old_path: str, old_label: str) -> None:
    """A candidate is now the run's model: it is ``current`` (on probation), the old one ``previous``."""
    state = read_state(update_dir)
    previous = state.get("current") or _model(old_path, old_label)
    if previous.get("path") != old_path:
        previous = _model(old_path, old_label)
    state.update(current=_model(new_path, label), previous=previous, probation={"starts": 1})
    write_state(update_dir, state)


def settle(update_dir: str | Path, rolled_back_to: tuple[str, str] | None = None) -> None:
    """Probation is over: the current model lived through it, or (``rolled_back_to``: path, label) it was
    rolled back, and the previous one is current again."""
    state = read_state(update_dir)
    if rolled_back_to is not None:
        bad = state.get("current")
        state["current"] = _model(*rolled_back_to)
        state["previous"] = None
        state["rolled_back"] = bad
    state.pop("probation", None)
    write_state(update_dir, state)


def request_rollback(update_dir: str | Path) -> dict[str, Any]:
    """``edgert update --rollback``: the previous model becomes current in the state file (the next start takes
    it) and a running pipeline is asked to swap back (it watches for the ``rollback`` request file). Returns
    the model rolled back to; raises :class:`~edgert.errors.ConfigError` when there is none."""
    from edgert.errors import ConfigError

    state = read_state(update_dir)
    previous = state.get("previous")
    if not previous:
        raise ConfigError(f"{update_dir}: no previous model to roll back to. Note: a rollback needs a model "
                          "that an update replaced")
    settle(update_dir, (previous["path"], previous.get("label", Path(previous["path"]).name)))
    write_atomic(Path(update_dir) / "rollback", json.dumps(previous) + "\n")
    return dict(previous)


def start_config(config: PipelineConfig) -> PipelineConfig:
    """The config a (re)start runs with: the model of the state file when there is one, else ``config``'s.

    A model on probation that has started :data:`CRASH_STARTS` times without living through probation (a unit
    restarting in a loop) is rolled back here: this start takes the previous model, and says so in one line."""
    update_dir = config.model.update_dir
    if not update_dir:
        return config
    state = read_state(update_dir)
    current = state.get("current")
    if not current:
        return config
    probation = state.get("probation")
    previous = state.get("previous")
    if probation and previous and int(probation.get("starts", 0)) >= CRASH_STARTS:
        log.warning("model update: rolled back to %s: crash loop (%d starts on %s within its probation)",
                    previous.get("label"), int(probation["starts"]), current.get("label"))
        settle(update_dir, (previous["path"], previous.get("label", "")))
        current = previous
    elif probation:
        probation["starts"] = int(probation.get("starts", 0)) + 1
        write_state(update_dir, state)
    path = str(current.get("path", ""))
    if not path or not os.path.isfile(path):
        log.warning("model update: %s in %s is gone; starting on the configured model", path, STATE_FILE)
        return config
    if path != config.model.path:
        log.info("model update: starting on %s (the last swapped-in model)", current.get("label") or path)
    return dataclasses.replace(config, model=dataclasses.replace(config.model, path=path))
