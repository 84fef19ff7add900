"""Install, remove and inspect a pipeline's systemd unit.

``install`` renders the unit (see :mod:`edgert.service.unit`), writes it with an environment file,
creates the service user and output folders when run as root, then ``systemctl daemon-reload`` and
``enable --now``. On a machine where systemd is not the init system (a container, a build host) it
writes the files and says which commands to run on the target. ``--dry-run`` only prints the unit.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edgert._package_data import read_text
from edgert.atomic_file import replace_file
from edgert.config import PipelineConfig, load_config
from edgert.errors import ServiceError
from edgert.service.unit import (
    DEFAULT_DEVICE_ALLOW,
    UnitOptions,
    check_service_paths,
    discover_device_allow,
    hidden_paths,
    output_paths,
    render_unit,
    unit_name,
)

__all__ = [
    "SYSTEM_UNIT_DIR",
    "InstallPlan",
    "find_edgert",
    "install",
    "plan_install",
    "status",
    "systemd_running",
    "uninstall",
]

log = logging.getLogger(__name__)

SYSTEM_UNIT_DIR = "/etc/systemd/system"


def systemd_running() -> bool:
    """Whether systemd is this machine's init system (the check sd_booted(3) makes)."""
    return os.path.isdir("/run/systemd/system")


def find_edgert() -> str:
    """The absolute path of the edgert command of this installation (its virtualenv's bin/ first)."""
    candidate = Path(sys.prefix) / "bin" / "edgert"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("edgert")
    if found:
        return os.path.abspath(found)
    raise ServiceError("cannot find the edgert command; install edgert (pip install edgert) or pass --edgert PATH")


def _existing_groups(names: Sequence[str]) -> tuple[str, ...]:
    kept = []
    for name in names:
        try:
            grp.getgrnam(name)
        except KeyError:
            log.warning("group %s does not exist here; leaving it out of SupplementaryGroups", name)
            continue
        kept.append(name)
    return tuple(kept)


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _device_rules() -> tuple[str, ...]:
    found = discover_device_allow()
    if not found:
        return DEFAULT_DEVICE_ALLOW
    # A camera plugged in after installation still needs V4L2 access.
    return tuple(dict.fromkeys([*found, "char-video4linux rw"]))


@dataclass(frozen=True)
class InstallPlan:
    config: PipelineConfig
    options: UnitOptions
    unit_path: Path
    env_path: Path
    unit_text: str


def plan_install(config_path: str | Path, name: str, *, user: str = "edgert", unit_dir: str | Path = SYSTEM_UNIT_DIR,
                 edgert: str | None = None, env_file: str | None = None, metrics: str | None = None,
                 watchdog_s: int = 30, for_this_machine: bool = True) -> InstallPlan:
    """Everything ``install`` would write, computed without touching the system."""
    unit = unit_name(name)
    config_abs = Path(config_path).resolve()
    config: PipelineConfig = load_config(config_abs)
    check_service_paths(config, name)
    if config.model.path:
        model = Path(config.model.path)
        if not model.exists():
            log.warning("model %s does not exist here; the service will fail to start until it does", model)
        if config.model.backend == "auto" and model.suffix.lower() == ".onnx" and for_this_machine:
            from edgert._lazy import is_importable

            if is_importable("tensorrt"):
                log.warning("model.backend is auto: set it to tensorrt in %s so the service builds the engine "
                            "once before it starts", config_abs)
    options = UnitOptions(
        name=name, config_path=str(config_abs), edgert=edgert or find_edgert(), user=user,
        env_file=env_file, metrics=metrics, watchdog_s=watchdog_s,
    )
    if for_this_machine:
        options = replace(options, groups=_existing_groups(options.groups), device_allow=_device_rules())
    text = render_unit(config, options)
    for note in hidden_paths(config, options):
        log.warning("%s", note)
    env_path = Path(env_file or f"/etc/edgert/{name}.env")
    return InstallPlan(config, options, Path(unit_dir) / unit, env_path, text)


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemctl")
    if exe is None:
        raise ServiceError("systemctl not found: this machine does not run systemd")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    return proc


def _systemctl_checked(*args: str) -> None:
    proc = _systemctl(*args)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise ServiceError(f"systemctl {' '.join(args)} failed: {detail[-1] if detail else proc.returncode}")


def _create_user(user: str) -> None:
    useradd = shutil.which("useradd")
    if useradd is None:
        raise ServiceError(f"user {user} does not exist and useradd is missing; create the user, or pass --user")
    proc = subprocess.run(
        [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/var/lib/edgert",
         "--shell", "/usr/sbin/nologin", "--comment", "edgert pipeline service", user],
        capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ServiceError(f"cannot create user {user}: {proc.stderr.strip()}")
    log.info("created system user %s", user)


def install(plan: InstallPlan, start: bool = True) -> list[str]:
    """Write the unit and environment file and enable the service. Returns the lines to tell the user."""
    user = plan.options.user
    is_root = os.geteuid() == 0
    if not _user_exists(user):
        if not is_root:
            raise ServiceError(f"user {user} does not exist: run as root to create it, or pass --user USER")
        _create_user(user)
    try:
        replace_file(plan.unit_path, plan.unit_text)
    except PermissionError:
        raise ServiceError(f"cannot write {plan.unit_path}: run with sudo, or pass --unit-dir") from None
    told = [f"wrote {plan.unit_path}"]
    if not plan.env_path.exists():
        example = read_text("edgert.service", "templates/edgert.env")
        try:
            # 0600: the file may come to hold secrets (the MQTT broker's password); systemd reads it as root.
            replace_file(plan.env_path, example, mode=0o600)
        except PermissionError:
            raise ServiceError(f"cannot write {plan.env_path}: run with sudo, or pass --env-file") from None
        told.append(f"wrote {plan.env_path}")
    pw = pwd.getpwnam(user)
    for folder in output_paths(plan.config):
        path = Path(folder)
        if not path.exists():
            try:
                path.mkdir(parents=True)
            except PermissionError:
                raise ServiceError(f"cannot create output folder {path}: run with sudo") from None
            if is_root:
                os.chown(path, pw.pw_uid, pw.pw_gid)
            told.append(f"created {path}")
    unit = plan.unit_path.name
    if systemd_running() and plan.unit_path.parent == Path(SYSTEM_UNIT_DIR):
        _systemctl_checked("daemon-reload")
        _systemctl_checked("enable", *(["--now"] if start else []), unit)
        told.append(f"enabled {unit}" + (" and started it" if start else ""))
    else:
        where = plan.unit_path.parent
        why = f"{where} is not {SYSTEM_UNIT_DIR}" if systemd_running() else "systemd is not running here"
        told.append(f"{why}; on the target run: sudo systemctl daemon-reload && sudo systemctl enable --now {unit}")
    return told


def uninstall(name: str, unit_dir: str | Path = SYSTEM_UNIT_DIR) -> list[str]:
    unit = unit_name(name)
    path = Path(unit_dir) / unit
    if not path.exists():
        raise ServiceError(f"{path} does not exist: no service named {name} is installed there")
    told = []
    managed = systemd_running() and path.parent == Path(SYSTEM_UNIT_DIR)
    if managed:
        _systemctl_checked("disable", "--now", unit)
        told.append(f"stopped and disabled {unit}")
    try:
        path.unlink()
    except PermissionError:
        raise ServiceError(f"cannot remove {path}: run with sudo") from None
    told.append(f"removed {path} (the environment file, engine cache and outputs are kept)")
    if managed:
        _systemctl_checked("daemon-reload")
    return told


def status(name: str, unit_dir: str | Path = SYSTEM_UNIT_DIR) -> tuple[int, str]:
    """(exit code, text): systemctl's view when systemd runs, else whether the unit file is there."""
    unit = unit_name(name)
    path = Path(unit_dir) / unit
    if systemd_running() and path.parent == Path(SYSTEM_UNIT_DIR):
        show = _systemctl("show", unit, "--property=LoadState,ActiveState,SubState,StatusText,NRestarts,MainPID")
        detail = _systemctl("status", unit, "--no-pager", "--lines=10")
        return detail.returncode, (show.stdout + "\n" + detail.stdout).strip()
    if not path.exists():
        raise ServiceError(f"{path} does not exist: no service named {name} is installed there")
    return 0, f"{unit}: installed at {path}; systemd is not managing it here (not running, or not {SYSTEM_UNIT_DIR})"
