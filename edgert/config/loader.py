"""Loading a config file: bounded YAML reading (size, alias-expanded node count, duplicate keys), the line of
every key for errors, and the paths in the file made relative to the file's folder."""

from __future__ import annotations

import dataclasses
import os
import select
import stat
import time
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from edgert.config.convert import _Where, from_mapping
from edgert.config.schema import PipelineConfig, SourceConfig
from edgert.errors import ConfigError
from edgert.jsonl_uri import JSONL, STDOUT, jsonl_path

if TYPE_CHECKING:
    import yaml  # imported where a file is loaded: ``import edgert`` needs numpy alone

T = TypeVar("T")


#: A config is a few kilobytes; past this it is not a config (and PyYAML takes minutes and GBs on 100 MB).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
FIFO_WAIT_S = 10.0  # a config read from a FIFO: how long its writer may take to start
#: Nodes the document may hold once aliases are expanded. Aliases share nodes in the composed tree but
#: every consumer that walks the data expands them: nine nested aliases of nine items are 387 million.
MAX_CONFIG_NODES = 100_000


def _expanded_size(node: yaml.Node, memo: dict[int, int], filename: str) -> int:
    """Nodes under ``node`` with every alias expanded, counted without expanding (each node once)."""
    import yaml

    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a node that contains itself (a recursive alias) counts once, not forever
    total = 1
    if isinstance(node, yaml.MappingNode):
        children: list[yaml.Node] = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    for child in children:
        total += _expanded_size(child, memo, filename)
        if total > MAX_CONFIG_NODES:
            line = node.start_mark.line + 1
            raise ConfigError(f"{filename}:{line}: more than {MAX_CONFIG_NODES} values once aliases are expanded. "
                              "Note: a config this large is a mistake or an alias bomb")
    memo[id(node)] = total
    return total


def _key_lines(node: yaml.Node, prefix: tuple[str, ...], out: dict[tuple[str, ...], int],
               filename: str, active: set[int]) -> None:
    """Record the line of every key path, and refuse a key given twice in one mapping (naming both lines).

    Bounded by :func:`_expanded_size` having run first; ``active`` stops a recursive alias.
    """
    import yaml

    if id(node) in active:
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key != "<<" and isinstance(key_node, yaml.ScalarNode):  # merge keys are YAML's own override
                if key in seen:
                    name = ".".join((*prefix, key))
                    raise ConfigError(f"{filename}:{line}: {name}: given twice (also at line {seen[key]}). "
                                      "Note: remove one; YAML would silently keep the last")
                seen.setdefault(key, line)
            path = (*prefix, key)
            out.setdefault(path, line)
            _key_lines(value_node, path, out, filename, active)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, str(i))
            out.setdefault(path, item.start_mark.line + 1)
            _key_lines(item, path, out, filename, active)
    active.discard(id(node))


def _read_limited(p: Path) -> bytes:
    """At most one byte past the limit of ``p``, whatever the file (a FIFO, /dev/zero). A FIFO is opened without
    blocking and read once something is written to it: one nobody writes to would block the open for good, past
    a stop and Ctrl-C (``<(...)`` of a shell is a pipe with its writer there: read as before)."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            deadline = time.monotonic() + FIFO_WAIT_S
            while not poller.poll(100):  # signal handlers run between the polls: Ctrl-C and SIGTERM work
                if time.monotonic() >= deadline:
                    raise ConfigError(f"{p}: a FIFO nothing writes to (waited {FIFO_WAIT_S:g} s). Note: start "
                                      "its writer first, or give a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read(MAX_CONFIG_BYTES + 1)
    finally:
        if fd >= 0:
            os.close(fd)


def _read_config_text(p: Path) -> str:
    try:
        raw = _read_limited(p)
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a folder, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: config file is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB. "
                          "Note: a pipeline config is a few kilobytes; is this the right file?")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: cannot read config: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


@typing.overload
def load_config(path: str | Path) -> PipelineConfig: ...
@typing.overload
def load_config(path: str | Path, cls: type[T]) -> T: ...
def load_config(path: str | Path, cls: type[Any] = PipelineConfig) -> Any:
    """Load a YAML file into ``cls`` (a pipeline by default); every problem is a one-line :class:`ConfigError`.

    Bounded: files over :data:`MAX_CONFIG_BYTES` and documents over :data:`MAX_CONFIG_NODES` values (aliases
    expanded) are refused before anything walks them; a key given twice in one mapping is an error.
    """
    import yaml

    p = Path(path)
    text = _read_config_text(p)
    # Compose once, check the node tree, then construct from the same tree (no second parse).
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[tuple[str, ...], int] = {}
        if node is not None:
            _expanded_size(node, {}, str(p))
            _key_lines(node, (), lines, str(p), set())
            data = loader.construct_document(node)
        else:
            data = None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        raise ConfigError(f"{p}:{line}: invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p}: invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    loaded = from_mapping(cls, data, _Where(str(p), lines, p.resolve().parent))
    if isinstance(loaded, PipelineConfig):
        loaded = _rebase_paths(loaded, p.resolve().parent)
    return loaded


def _rebase(text: str, base: Path) -> str:
    """A relative local path (or ``file://``/``jsonl://`` path) in a file made relative to ``base``; URIs of
    other schemes, ``-``, camera indices, ``~`` and absolute paths as they are."""
    rest = jsonl_path(text)
    if rest is not None:
        return text if rest in ("", STDOUT) else JSONL + _rebase(rest, base)
    if text.startswith("file://"):
        return text if not text[len("file://"):] else "file://" + _rebase(text[len("file://"):], base)
    if not text or text == "-" or "://" in text or text.isdigit() or text.startswith(("/", "~")):
        return text
    return str(base / text)


def _rebase_paths(config: PipelineConfig, base: Path) -> PipelineConfig:
    """Paths in a YAML file follow the file, not the working directory (as ``decode.names`` and recipes do):
    model, engine cache, sources, sinks (a source's own too) and the speech models."""
    def source(s: SourceConfig) -> SourceConfig:
        return dataclasses.replace(s, uri=_rebase(s.uri.strip(), base) if s.uri.strip() else s.uri,
                                   sinks=tuple(_rebase(x, base) for x in s.sinks))

    model = config.model
    model = dataclasses.replace(model, path=_rebase(model.path, base),
                                engine_cache=_rebase(model.engine_cache, base) if model.engine_cache else None,
                                update_dir=_rebase(model.update_dir, base) if model.update_dir else None,
                                update_files=_rebase(model.update_files, base) if model.update_files else None)
    sp = config.speech
    speech = dataclasses.replace(
        sp, vad=dataclasses.replace(sp.vad, model=_rebase(sp.vad.model, base)),
        wakeword=dataclasses.replace(sp.wakeword, models=tuple(_rebase(m, base) for m in sp.wakeword.models),
                                     melspec=_rebase(sp.wakeword.melspec, base),
                                     embedding=_rebase(sp.wakeword.embedding, base)),
        asr=dataclasses.replace(sp.asr, model=_rebase(sp.asr.model, base)))
    return dataclasses.replace(config, model=model, source=source(config.source),
                               sources=tuple(source(s) for s in config.sources),
                               sinks=tuple(_rebase(x, base) for x in config.sinks), speech=speech)
