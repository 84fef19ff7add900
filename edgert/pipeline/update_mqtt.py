"""The MQTT door of a model update: ``<prefix>/<device>/model/update`` in, ``<prefix>/<device>/model/status`` out.

``model.update_mqtt: mqtt://BROKER:1883/PREFIX/DEVICE`` and ``model.update_files: /FOLDER`` turn it on. A command
names a file **already on the device**, inside ``model.update_files`` (a fleet's file sync put it there), with
its sha256 and the settings; nothing is ever fetched from the network, and the broker authenticates who may
publish (credentials from the environment, as for the MQTT sink)::

    {"file": "yolo-v2.onnx", "sha256": "9f2c...", "precision": "int8", "images": "calib/", "reference": "..."}

A command is refused with one status message (``{"state": "refused", "why": ...}``) when it is not JSON, asks to
fetch a URL, names a file outside the folder (``..``, an absolute path elsewhere, a link leading out), a file
that is not there, or one whose sha256 differs. An accepted one is copied into ``models/`` and goes the way of a
dropped file; each of its states is a status message too (:mod:`edgert.pipeline.update_door`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from edgert.atomic_file import sha256_file
from edgert.errors import ConfigError

if TYPE_CHECKING:
    from edgert.pipeline.state import RunState

__all__ = ["SETTINGS", "attach_mqtt", "check_command"]

log = logging.getLogger(__name__)

#: what a command may say beside the file and its sha256
SETTINGS = ("precision", "images", "reference")


def _inside(folder: Path, name: str) -> Path | None:
    """``name`` (relative to ``folder``, or absolute) resolved, links followed, if it stays inside ``folder``."""
    root = folder.resolve()
    path = (root / name).resolve()
    return path if path == root or root in path.parents else None


def check_command(payload: bytes, folder: Path) -> tuple[Path, dict[str, Any]]:
    """The file and settings of an update command; :class:`ConfigError` (one line, the status's ``why``) when
    it is refused."""
    try:
        cmd = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigError("not a JSON command") from None
    if not isinstance(cmd, dict):
        raise ConfigError("not a JSON object")
    unknown = sorted(set(cmd) - {"file", "sha256", *SETTINGS})
    if unknown:
        raise ConfigError(f"unknown keys {', '.join(unknown)}: a command names a file already on the device "
                          f"(file, sha256, {', '.join(SETTINGS)}); nothing is fetched")
    name, digest = cmd.get("file"), cmd.get("sha256")
    if not isinstance(name, str) or not name or not isinstance(digest, str) or not digest:
        raise ConfigError("file and sha256 are required")
    if urlsplit(name).scheme:
        raise ConfigError(f"{name!r} is a URL: nothing is fetched; put the file in the update folder first")
    path = _inside(folder, name)
    if path is None:
        raise ConfigError(f"{name!r} is outside the allowed folder")
    if not path.is_file():
        raise ConfigError(f"{name!r}: no such file in the allowed folder")
    if sha256_file(path) != digest.lower():
        raise ConfigError(f"{name!r}: sha256 differs from the command's")
    settings: dict[str, Any] = {}
    if "precision" in cmd:
        if cmd["precision"] not in ("fp32", "int8"):
            raise ConfigError(f"precision {cmd['precision']!r}: expected fp32 or int8")
        settings["precision"] = cmd["precision"]
    for key in ("images", "reference"):
        if key in cmd:
            inside = _inside(folder, str(cmd[key]))
            if inside is None or not os.path.exists(inside):
                raise ConfigError(f"{key} {cmd[key]!r}: not in the allowed folder")
            settings[key] = str(inside)
    return path, settings


class Door(Protocol):
    """What the MQTT door needs of the update door (:class:`edgert.pipeline.update_door.UpdateDoor`)."""

    listeners: list[Callable[[dict[str, Any]], None]]
    closers: list[Callable[[], None]]

    def submit(self, path: Path, settings: dict[str, Any], via: str) -> None: ...


def attach_mqtt(run: RunState, door: Door) -> None:
    """Subscribe to the command topic of ``model.update_mqtt``; the door's states go to the status topic."""
    from edgert.io.mqtt_commands import MqttCommands

    cfg = run.config.model
    if not cfg.update_files:
        raise ConfigError("model.update_mqtt needs model.update_files: the folder a command may name files in")
    folder = Path(cfg.update_files)
    base = urlsplit(str(cfg.update_mqtt)).path.strip("/")
    status_topic, command_topic = f"{base}/model/status", f"{base}/model/update"

    def command(payload: bytes) -> None:
        try:
            path, settings = check_command(payload, folder)
        except ConfigError as exc:
            log.warning("model update: an MQTT command was refused: %s", exc)
            client.status({"state": "refused", "why": str(exc)})
            return
        door.submit(path, settings, via="mqtt")

    client = MqttCommands.open_topics(str(cfg.update_mqtt), status_topic, command_topic, command)
    door.listeners.append(client.status)
    door.closers.append(client.close)
