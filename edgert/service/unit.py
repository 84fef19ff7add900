"""Render a systemd unit for one pipeline config from the packaged template.

The template (``templates/edgert.service.in``) is the single source of the unit's text; ``jetson/``
holds an example rendered from it, which a test keeps in step. What depends on the pipeline is
computed here: the ordering on ``nvargus-daemon.service`` for CSI cameras and ``network-online.target``
for network streams, the engine build before start, the paths the service may write, and the devices
it may open.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgert._package_data import read_text
from edgert.allocator import environment as allocator_environment
from edgert.config import PipelineConfig
from edgert.errors import ServiceError
from edgert.io.uri import ARGUS, NETWORK
from edgert.redact import has_literal_secret, redact
from edgert.service.unit_check import check_name, check_rendered, check_value

if TYPE_CHECKING:
    from edgert.io.sinks.registry import SinkKind

__all__ = [
    "DEFAULT_DEVICE_ALLOW",
    "DEVICE_GLOBS",
    "UnitOptions",
    "check_service_paths",
    "check_service_sinks",
    "discover_device_allow",
    "engine_path",
    "hidden_paths",
    "output_paths",
    "render_unit",
    "source_needs",
    "template_text",
    "unit_name",
]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HOME_ROOTS = ("/home", "/root", "/run/user")

#: Device nodes a pipeline may need: cameras (V4L2, media controller), Jetson's GPU and multimedia
#: engines (nvhost-*, nvmap, nvgpu), desktop NVIDIA GPUs (nvidia*), DRM render nodes.
DEVICE_GLOBS: tuple[str, ...] = (
    "/dev/video*", "/dev/media*", "/dev/nvmap", "/dev/nvhost-*", "/dev/nvgpu/*/*", "/dev/nvidia*",
    "/dev/nvidia-caps/*", "/dev/dri/renderD*",
)

#: Used when the unit is rendered on a machine without those nodes (a laptop preparing a Jetson's
#: unit): device groups from /proc/devices by name (they cover hot-plugged cameras) plus the known
#: Jetson nodes by path. systemd ignores groups and paths that do not exist on the target. nvgpu
#: registers its nodes under the GPU's platform device name (57000000.gpu on Nano, *.gp10b TX2,
#: *.gv11b Xavier, *.ga10b Orin), host1x clients under "nvhost"; Thor and dGPUs use nvidia*.
DEFAULT_DEVICE_ALLOW: tuple[str, ...] = (
    "char-video4linux rw", "char-media rw", "char-drm rw", "char-nvidia* rw", "char-nvhost rw",
    "char-*.gpu rw", "char-*.gp10b rw", "char-*.gv11b rw", "char-*.ga10b rw",
    "/dev/nvmap rw", "/dev/nvhost-ctrl rw", "/dev/nvhost-ctrl-gpu rw", "/dev/nvhost-gpu rw",
    "/dev/nvhost-as-gpu rw", "/dev/nvhost-prof-gpu rw", "/dev/nvhost-dbg-gpu rw", "/dev/nvhost-tsg-gpu rw",
    "/dev/nvhost-sched-gpu rw", "/dev/nvhost-ctxsw-gpu rw", "/dev/nvhost-vic rw", "/dev/nvhost-nvdec rw",
    "/dev/nvhost-msenc rw", "/dev/nvhost-nvjpg rw", "/dev/nvhost-ctrl-nvdla0 rw", "/dev/nvhost-ctrl-nvdla1 rw",
    "/dev/nvhost-nvdla0 rw", "/dev/nvhost-nvdla1 rw",
)

# Device groups too broad to allow whole (misc holds nvmap but also /dev/fuse, /dev/kvm, ...): for
# nodes in these, allow the node itself.
_BROAD_GROUPS = frozenset({"mem", "misc", "tty", "pty", "pts", "ptm", "ttyS", "input", "sg", "usb", "block"})


def unit_name(name: str) -> str:
    if not _NAME.match(name):
        raise ServiceError(f"service name {name!r}: use letters, digits, '-', '_' or '.', e.g. camera-front")
    return f"edgert-{name}.service"


def template_text() -> str:
    return read_text("edgert.service", "templates/edgert.service.in")


@dataclass(frozen=True)
class UnitOptions:
    """What the unit needs beyond the pipeline config. Paths must be absolute on the target."""

    name: str
    config_path: str
    edgert: str  # the edgert executable, e.g. /opt/edgert/venv/bin/edgert
    user: str = "edgert"
    group: str | None = None  # default: the user's name
    groups: tuple[str, ...] = ("video", "render")
    env_file: str | None = None  # default: /etc/edgert/NAME.env
    watchdog_s: int = 30
    start_timeout_s: int = 1800
    stop_timeout_s: int = 30
    # A camera still booting fails a start only after source.timeout_s of retries (5 s), so such a start
    # takes restart_s + ~2 s + 5 s >= 17 s: at most 10 in 180 s, under the burst of 12. A crash loop (a start
    # failing at once, ~12 s a round) exceeds it and leaves the unit failed for an operator to see.
    restart_s: int = 10
    start_limit_interval_s: int = 180
    start_limit_burst: int = 12
    metrics: str | None = None  # HOST:PORT for --metrics
    device_allow: tuple[str, ...] = DEFAULT_DEVICE_ALLOW
    extra_read_write: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------------------------------
# What the pipeline implies


def source_needs(config: PipelineConfig) -> set[str]:
    """What every source of ``config`` needs from the machine, as their rows say (argus, network)."""
    from edgert.io.sources import source_kind

    uris = [src.uri.strip() for src in config.all_sources() if src.uri.strip()]
    return {need for uri in uris for need in source_kind(uri).needs(uri)}


def _source_paths(config: PipelineConfig) -> list[tuple[str, str, str]]:
    """``(key, uri, path)`` for each local path the sources read, as their rows say."""
    from edgert.io.sources import source_kind

    out = []
    for i, src in enumerate(config.all_sources()):
        uri = src.uri.strip()
        path = source_kind(uri).reads(uri) if uri else None
        if path:
            out.append(("source.uri" if not config.sources else f"sources[{i}].uri", uri, path))
    return out


def _sink_rows(config: PipelineConfig) -> list[tuple[str, SinkKind]]:
    """Every sink URI of a run of ``config`` (shared and per source, ``{source}`` expanded) with its row."""
    from edgert.errors import SinkError
    from edgert.io.sinks.plan import config_sinks
    from edgert.io.sinks.registry import sink_kind

    try:
        return [(uri.strip(), sink_kind(uri)) for uri in config_sinks(config)]
    except SinkError as exc:
        raise ServiceError(f"sinks: {exc}") from None


def _publishes(config: PipelineConfig) -> bool:
    """Whether a sink sends to another machine (RTSP server, MQTT broker): the unit then waits for the network."""
    return any(row.remote for _, row in _sink_rows(config))


def check_service_sources(config: PipelineConfig) -> None:
    """A source URI with a password written out is refused: the config is readable by the unit's readers.
    Credentials go in the EnvironmentFile and the URI names them (``rtsp://${CAM_USER}:${CAM_PASSWORD}@cam``)."""
    for source in (config.source, *config.sources):
        if source.uri and has_literal_secret(source.uri):
            raise ServiceError(f"source {redact(source.uri)}: credentials do not belong in the config of a "
                               "service (readable, shown by ps). Note: put them in the EnvironmentFile and write "
                               "the URI as rtsp://${CAM_USER}:${CAM_PASSWORD}@HOST/PATH")


def check_service_sinks(config: PipelineConfig) -> None:
    """Sinks that can be judged before the service starts, as their rows say (an MQTT URI: topic, options,
    and no credentials)."""
    from edgert.errors import SinkError

    for uri, row in _sink_rows(config):
        try:
            row.check(uri)
        except SinkError as exc:
            raise ServiceError(f"sinks: {exc}") from None


def output_paths(config: PipelineConfig) -> list[str]:
    """Absolute folders the pipeline writes (sink outputs, a configured engine cache)."""
    out: list[str] = []
    for uri, row in _sink_rows(config):
        target = row.writes(uri)
        if target is None:
            continue
        p = Path(target)
        if p.is_absolute():  # relative outputs land in the working directory, the unit's StateDirectory
            out.append(str(p.parent))
    if config.model.engine_cache:
        out.append(config.model.engine_cache)
    if config.model.update_dir:  # candidates move to models/ and rejected/, the state file is written there
        out.append(config.model.update_dir)
    return sorted(set(out))


def check_service_paths(config: PipelineConfig, name: str) -> None:
    """Inputs must be absolute: a service runs in /var/lib/edgert/NAME, where relative paths would point."""
    where = f"a service runs in /var/lib/edgert/{name}; use an absolute path in the config"
    if config.model.path and not os.path.isabs(config.model.path):
        raise ServiceError(f"model.path {config.model.path!r} is relative: {where}")
    if config.model.engine_cache and not os.path.isabs(config.model.engine_cache):
        raise ServiceError(f"model.engine_cache {config.model.engine_cache!r} is relative: {where}")
    for key in ("update_dir", "update_files"):
        value = getattr(config.model, key)
        if value and not os.path.isabs(value):
            raise ServiceError(f"model.{key} {value!r} is relative: {where}")
    for key, uri, path in _source_paths(config):
        if not os.path.isabs(path):
            raise ServiceError(f"{key} {uri!r} is relative: {where}")


def _under_home(paths: Iterable[str]) -> bool:
    return any(_under(p, _HOME_ROOTS) for p in paths)


def _under(path: str, roots: Iterable[str]) -> str | None:
    """The root of ``roots`` that ``path`` lies under, if any."""
    for root in roots:
        if path == root or path.startswith(root + "/"):
            return root
    return None


_TMP_ROOTS = ("/tmp", "/var/tmp")  # both are replaced by empty private ones under PrivateTmp=yes


def _interpreter(executable: str) -> str | None:
    """The interpreter named on the ``#!`` line of a script (a pip-installed ``edgert`` is one)."""
    try:
        with open(executable, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode("utf-8", "replace").split()
    return parts[0] if parts and os.path.isabs(parts[0]) else None


def hidden_paths(config: PipelineConfig, opts: UnitOptions) -> list[str]:
    """What the unit's own hardening hides from the service it starts, one sentence each.

    ``PrivateTmp=yes`` gives the service an empty /tmp and /var/tmp; ``ProtectHome=yes`` makes /home,
    /root and /run/user disappear. A config, model, source, the edgert executable or its interpreter
    there is invisible to the service, which then fails at start with a confusing "file not found".
    """
    unit_values = _hardening(config, opts)
    model = config.model.path or None
    sources = [("source", path) for _, _, path in _source_paths(config) if os.path.isabs(path)]
    candidates = [("config", opts.config_path), ("model", model), *sources,
                  ("edgert executable", opts.edgert), ("Python interpreter", _interpreter(opts.edgert))]
    seen: set[str] = set()
    notes: list[str] = []
    for label, path in candidates:
        if not path:
            continue
        paths = [path]
        real = os.path.realpath(path)  # a venv's python links elsewhere: both must stay visible
        if real != path:
            paths.append(real)
        for p in paths:
            if p in seen:
                continue
            seen.add(p)
            tmp = _under(p, _TMP_ROOTS)
            if tmp and unit_values["PRIVATE_TMP"] == "yes":
                notes.append(f"the {label} {p} is under {tmp}, which PrivateTmp=yes replaces with an empty one "
                             "for the service: move it elsewhere (e.g. /opt or /etc/edgert)")
            home = _under(p, _HOME_ROOTS)
            if home and unit_values["PROTECT_HOME"] == "yes":
                notes.append(f"the {label} {p} is under {home}, which ProtectHome=yes hides from the service: "
                             "install it outside home folders (e.g. a venv in /opt/edgert)")
    return notes


# --------------------------------------------------------------------------------------------------
# Quoting: systemd expands %specifiers and $VARIABLES in Exec lines; paths must not be expanded.


def _exec_arg(arg: str, executable: bool = False) -> str:
    escaped = arg.replace("%", "%%")
    if not executable:  # systemd expands $VARIABLES in the arguments, never in the executable's name
        escaped = escaped.replace("$", "$$")
    if re.search(r"[\s\"'\\;]", escaped):
        return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped


def _exec_line(argv: Sequence[str]) -> str:
    return " ".join(_exec_arg(a, executable=i == 0) for i, a in enumerate(argv))


def _path_value(path: str, field: str = "an output folder") -> str:
    check_value(field, path)
    if re.search(r"[\s\"'\\]", path):
        raise ServiceError(f"{field} {path!r}: a path with blanks, quotes or backslashes cannot be listed in a "
                           "unit's path settings; move it")
    return path.replace("%", "%%")


def _check_values(config: PipelineConfig, opts: UnitOptions) -> None:
    """Every value the unit will hold stays on its line (see :mod:`edgert.service.unit_check`)."""
    for name, value in (("--config", opts.config_path), ("--edgert", opts.edgert), ("--metrics", opts.metrics),
                         ("--env-file", opts.env_file), ("model.path", config.model.path),
                         ("model.engine_cache", config.model.engine_cache), ("model.backend", config.model.backend),
                         ("model.precision", config.model.precision)):
        if value:
            check_value(name, value)
    for i, src in enumerate(config.all_sources()):
        check_value("source.uri" if not config.sources else f"sources[{i}].uri", src.uri)
    if re.search(r"[\"'\\]", opts.edgert):
        raise ServiceError(f"--edgert {opts.edgert!r}: systemd refuses an executable whose path holds quotes or "
                           "backslashes; install edgert elsewhere or pass a link to it")
    check_name("--user", opts.user)
    for group in (opts.group or opts.user, *opts.groups):
        check_name("group", group)
    for rule in opts.device_allow:
        check_value("DeviceAllow", rule)


# --------------------------------------------------------------------------------------------------
# Devices


def _proc_devices(text: str) -> dict[int, str]:
    majors: dict[int, str] = {}
    section = ""
    for line in text.splitlines():
        if line.endswith(":"):
            section = line
            continue
        parts = line.split()
        # Several names may share a major; names that are paths (/dev/tty) are not device groups.
        if (section.startswith("Character") and len(parts) == 2 and parts[0].isdigit()
                and not parts[1].startswith("/")):
            majors.setdefault(int(parts[0]), parts[1])
    return majors


def discover_device_allow(globs: Sequence[str] = DEVICE_GLOBS, proc_devices: str = "/proc/devices") -> list[str]:
    """DeviceAllow= values for the device nodes present on this machine.

    A node whose driver has its own group in /proc/devices is allowed by group (``char-video4linux``),
    which also covers nodes that appear later (a camera plugged in after boot); nodes of broad groups
    (``misc``: nvmap) are allowed one by one.
    """
    try:
        majors = _proc_devices(Path(proc_devices).read_text())
    except OSError:
        majors = {}
    rules: list[str] = []
    for pattern in globs:
        for node in sorted(glob.glob(pattern)):
            try:
                st = os.stat(node)
            except OSError:
                continue
            if not stat.S_ISCHR(st.st_mode):
                continue
            group = majors.get(os.major(st.st_rdev))
            rule = f"char-{group} rw" if group and group not in _BROAD_GROUPS else f"{node} rw"
            if rule not in rules:
                rules.append(rule)
    return rules


# --------------------------------------------------------------------------------------------------
# Rendering


def engine_path(config: PipelineConfig, name: str, model: Path | None) -> Path | None:
    """Where the unit keeps the engine for an ONNX model served by TensorRT, or None (nothing to build).

    The engine goes to the service's cache (``model.engine_cache``, else ``/var/cache/edgert/NAME``),
    not beside the model: the model folder stays read-only for the service.
    """
    from edgert.backends import builds_engines

    if model is None or model.suffix.lower() != ".onnx" or not builds_engines(config.model.backend):
        return None  # ONNX Runtime reads the ONNX file itself; an engine given directly needs no build
    return Path(config.model.engine_cache or f"/var/cache/edgert/{name}") / (model.stem + ".engine")


def _hardening(config: PipelineConfig, opts: UnitOptions) -> dict[str, str]:
    """ProtectHome= and PrivateTmp= for this pipeline (shared by the unit and :func:`hidden_paths`)."""
    writes = [*output_paths(config), *opts.extra_read_write]
    reads = [opts.config_path, *([config.model.path] if config.model.path else []), *writes]
    return {
        # A home directory stays readable when the model or config lives there, never writable
        # except for listed outputs.
        "PROTECT_HOME": "read-only" if _under_home(reads) else "yes",
        # libargus talks to nvargus-daemon through /tmp/argus_socket: a private /tmp would hide it.
        "PRIVATE_TMP": "no" if ARGUS in source_needs(config) else "yes",
    }


def render_unit(config: PipelineConfig, opts: UnitOptions) -> str:
    """The unit text for ``config``. Raises ServiceError for options that cannot make a valid unit."""
    unit_name(opts.name)
    for label, value in (("config", opts.config_path), ("edgert executable", opts.edgert)):
        if not os.path.isabs(value):
            raise ServiceError(f"{label} path {value!r} must be absolute in a unit file")
    if opts.watchdog_s <= 0 or opts.stop_timeout_s <= 0 or opts.start_timeout_s <= 0:
        raise ServiceError("watchdog, start and stop timeouts must be positive seconds")
    check_service_paths(config, opts.name)
    check_service_sinks(config)
    check_service_sources(config)
    _check_values(config, opts)
    model = Path(config.model.path) if config.model.path else None
    needs = source_needs(config)

    ordering: list[str] = []
    if ARGUS in needs:
        # libargus (nvarguscamerasrc) asks nvargus-daemon for frames
        ordering += ["After=nvargus-daemon.service", "Wants=nvargus-daemon.service"]
    if NETWORK in needs or _publishes(config):
        ordering += ["After=network-online.target", "Wants=network-online.target"]

    writes = [*output_paths(config), *opts.extra_read_write]
    read_write = [f"ReadWritePaths=-{_path_value(p)}" for p in sorted(set(writes))]

    exec_start = [opts.edgert, "run", "--config", opts.config_path]
    prestart: list[str] = []
    build: list[str] = []
    engine = engine_path(config, opts.name, model)
    if engine is not None and model is not None:
        # `edgert build` reuses the engine when its sidecar matches (model, precision, TensorRT, GPU), so
        # only the first start, or the first after a TensorRT upgrade, pays for the build.
        build = [opts.edgert, "build", str(model), "--backend", config.model.backend,
                 "--precision", config.model.precision, "-o", str(engine)]
        prestart.append(f"ExecStartPre={_exec_line(build)}")
        exec_start += ["--model", str(engine)]
    if opts.metrics:
        exec_start += ["--metrics", opts.metrics]
    env_file = opts.env_file or f"/etc/edgert/{opts.name}.env"

    uris = [src.uri for src in config.all_sources() if src.uri]
    summary = redact(f"{model.name if model else 'no model'} on {', '.join(uris) or 'no source'}")
    values = {
        "HEADER": f"Rendered by `edgert service install` for {opts.config_path}. Edit that config, "
                  "then install again.",
        "NAME": opts.name,
        "SUMMARY": summary.replace("%", "%%"),
        "START_LIMIT_INTERVAL": str(opts.start_limit_interval_s),
        "START_LIMIT_BURST": str(opts.start_limit_burst),
        "RESTART_SEC": str(opts.restart_s),
        "START_TIMEOUT": str(opts.start_timeout_s),
        "STOP_TIMEOUT": str(opts.stop_timeout_s),
        "STOP_DEADLINE": str(max(1, opts.stop_timeout_s // 2)),
        "USER": opts.user,
        "GROUP": opts.group or opts.user,
        "GROUPS": " ".join(opts.groups),
        "ENV_FILE": _path_value(env_file, "--env-file"),
        "EXEC_START": _exec_line(exec_start),
        "MALLOC_ENV": " ".join(f"{k}={v}" for k, v in allocator_environment().items()),
        **_hardening(config, opts),
    }
    progress = ("the pipeline's progress" if config.task == "detect" else
                "the pipeline's progress (audio chunks, and every decoder step of a long Whisper window)")
    service_type = [
        "# edgert says READY=1 once the model is loaded and the first frame went through, and WATCHDOG=1",
        f"# from {progress}: a pipeline that stops delivering frames is killed (SIGABRT, with a",
        "# Python traceback of every thread in the journal) and restarted after WatchdogSec.",
        "Type=notify",
        "NotifyAccess=main",
        f"WatchdogSec={opts.watchdog_s}",
    ]
    blocks = {
        "SERVICE_TYPE": service_type,
        "UNIT_ORDERING": ordering,
        "EXEC_START_PRE": prestart,
        "READ_WRITE_PATHS": read_write,
        "DEVICE_ALLOW": [f"DeviceAllow={rule}" for rule in opts.device_allow],
    }
    lines: list[str] = []
    meant: list[tuple[str, str, str]] = []  # (section, key, value) of every setting, as meant
    section = ""
    for line in template_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("@") and stripped.endswith("@") and stripped[1:-1] in blocks:
            for entry in blocks[stripped[1:-1]]:
                lines.append(entry)
                _mean(meant, section, entry, entry)
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
        rendered = line
        for key, value in values.items():
            rendered = rendered.replace(f"@{key}@", value)
        lines.append(rendered)
        _mean(meant, section, line, rendered)
    text = "\n".join(lines) + "\n"
    leftover = re.findall(r"@[A-Z_]+@", text)
    if leftover:
        raise ServiceError(f"unit template has unknown placeholders {sorted(set(leftover))}")  # an edgert bug
    text = re.sub(r"\n{3,}", "\n\n", text)
    check_rendered(text, meant, {"ExecStart": [exec_start], "ExecStartPre": [build] if build else []})
    return text


def _mean(meant: list[tuple[str, str, str]], section: str, template_line: str, rendered: str) -> None:
    """Record the setting a template line meant (its key is the template's, its value what was put in)."""
    stripped = template_line.strip()
    if not stripped or stripped.startswith(("#", ";")) or (stripped.startswith("[") and stripped.endswith("]")):
        return
    key = template_line.partition("=")[0].strip()
    meant.append((section, key, rendered.partition("=")[2].strip()))

