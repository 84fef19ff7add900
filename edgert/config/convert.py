"""Plain data (parsed YAML, a dict) to config dataclasses: :func:`from_mapping` checks every key and type and
names the key path (and the file line, through :class:`_Where`) of what is wrong; the field annotations,
strings under ``from __future__ import annotations``, are parsed here in a way Python 3.8 can."""

from __future__ import annotations

import ast
import dataclasses
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Tuple, TypeVar, Union

from edgert.coco import COCO_NAMES
from edgert.config.schema import DecodeConfig, FieldError, ModelConfig, SourceConfig, _kind
from edgert.errors import ConfigError

T = TypeVar("T")


class _Where:
    """Where a value came from: file name plus the line of each key path."""

    def __init__(self, filename: str, lines: dict[tuple[str, ...], int], base: Path | None = None) -> None:
        self.filename = filename
        self.lines = lines
        self.base = base  # the folder relative paths in the file are relative to

    def error(self, path: tuple[str, ...], message: str) -> ConfigError:
        key = ".".join(path) if path else "(top level)"
        line = None
        probe = path
        while probe and line is None:  # a missing key is blamed on its parent's line
            line = self.lines.get(probe)
            probe = probe[:-1]
        loc = f"{self.filename}:{line}" if line is not None else self.filename
        return ConfigError(f"{loc}: {key}: {message}")



#: Stage configs that may be given as one string in YAML, and the field the string fills:
#: ``model: yolov8n.onnx`` is ``model: {path: yolov8n.onnx}``, ``source: /dev/video0`` is ``source: {uri: ...}``.
SHORTHANDS: dict[type, str] = {ModelConfig: "path", SourceConfig: "uri"}


def _labels(value: str, where: _Where, path: tuple[str, ...]) -> tuple[str, ...]:
    """``decode.names`` as a string: ``coco`` (the 80 COCO names) or a labels file, one name per line.

    The file format is the one jetson-inference and DeepStream use; a relative path is relative to the
    YAML file's folder (the working directory for configs not read from a file).
    """
    if value.strip().lower() == "coco":
        return COCO_NAMES
    labels = Path(value).expanduser()
    if not labels.is_absolute() and where.base is not None:
        labels = where.base / labels
    try:
        text = labels.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise where.error(path, f"labels file {labels} not found. Note: give a file with one class name per line, "
                                "a list of names, or coco") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise where.error(path, f"cannot read labels file {labels}: {exc}") from None
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise where.error(path, f"labels file {labels} is empty")
    for i, line in enumerate(lines):
        if not line:  # an empty line would shift every class id after it
            raise where.error(path, f"{labels}:{i + 1}: empty line in the labels file (one class name per line)")
    return tuple(lines)


def from_mapping(cls: type[T], data: Any, where: _Where | None = None, path: tuple[str, ...] = ()) -> T:
    """Build the dataclass ``cls`` from plain data, checking every key and type."""
    where = where or _Where("<config>", {})
    shorthand = SHORTHANDS.get(cls)
    if shorthand is not None and isinstance(data, str):
        data = {shorthand: data}
    if not isinstance(data, Mapping):
        expected = f"a string ({shorthand}) or a mapping" if shorthand else "a mapping"
        raise where.error(path, f"expected {expected}, got {_kind(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key not in fields:
            valid = ", ".join(sorted(fields))
            raise where.error((*path, key), f"unknown key. Note: valid keys are {valid}")
        if cls is DecodeConfig and key == "names" and isinstance(value, str):
            kwargs[key] = _labels(value, where, (*path, key))
            continue
        kwargs[key] = _convert(hints[key], value, where, (*path, key))
    try:
        return cls(**kwargs)
    except FieldError as exc:
        raise where.error((*path, exc.field_name), exc.message) from None


# Field types. With ``from __future__ import annotations`` every annotation is a string; typing.get_type_hints
# would evaluate ``str | None`` and ``tuple[int, int]``, which Python 3.8 (JetPack 5) cannot. So the strings are
# parsed here, into the typing forms every supported Python has (Optional, Tuple, Literal).

_BUILTIN_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "None": type(None)}
_TYPES_CACHE: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    cached = _TYPES_CACHE.get(cls)
    if cached is None:
        namespace = vars(sys.modules[cls.__module__])
        cached = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            tp = f.type
            cached[f.name] = _parse_annotation(tp, namespace) if isinstance(tp, str) else tp
        _TYPES_CACHE[cls] = cached
    return cached


def _parse_annotation(text: str, namespace: Mapping[str, Any]) -> Any:
    try:
        node = ast.parse(text, mode="eval").body
        return _annotation(node, namespace)
    except (SyntaxError, KeyError, TypeError) as exc:
        raise TypeError(f"config field type {text!r} is not supported by the loader: {exc}") from None  # an edgert bug


def _subscript_items(node: ast.Subscript) -> list[ast.expr]:
    sub: Any = node.slice
    if sys.version_info < (3, 9) and isinstance(sub, ast.Index):  # Python 3.8 wraps the subscript
        sub = sub.value  # type: ignore[attr-defined,unused-ignore]
    return list(sub.elts) if isinstance(sub, ast.Tuple) else [sub]


def _annotation(node: ast.expr, namespace: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        if node.value is None:
            return type(None)
        if isinstance(node.value, str):
            return node.value  # a Literal's member
        raise TypeError(f"unexpected constant {node.value!r}")
    if isinstance(node, ast.Name):
        if node.id in _BUILTIN_TYPES:
            return _BUILTIN_TYPES[node.id]
        return namespace[node.id]  # a config dataclass of this module
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _annotation(node.left, namespace), _annotation(node.right, namespace)
        return Union[left, right]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        items = _subscript_items(node)
        head = node.value.id
        if head == "Literal":
            return Literal.__getitem__(tuple(_literal(i) for i in items))
        if head == "tuple":
            if len(items) == 2 and isinstance(items[1], ast.Constant) and items[1].value is Ellipsis:
                return Tuple[_annotation(items[0], namespace), ...]
            return Tuple.__getitem__(tuple(_annotation(i, namespace) for i in items))
        if head == "Optional":
            return Optional[_annotation(items[0], namespace)]
        if head == "dict" and len(items) == 2:
            key, value = _annotation(items[0], namespace), _annotation(items[1], namespace)
            return Dict[key, value]  # type: ignore[valid-type]
    raise TypeError(ast.dump(node))


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    raise TypeError(f"unexpected Literal member {ast.dump(node)}")


def _convert(tp: Any, value: Any, where: _Where, path: tuple[str, ...]) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where, path)
        errors = []
        for a in inner:
            try:
                return _convert(a, value, where, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[-1]
    if origin is Literal:
        if value not in args:
            choices = ", ".join(str(a) for a in args)
            raise where.error(path, f"expected one of {choices}, got {_kind(value)}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise where.error(path, f"expected a list, got {_kind(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, where, (*path, str(i))) for i, v in enumerate(value))
        if len(value) != len(args):
            noun = "numbers" if all(a in (int, float) for a in args) else "items"
            raise where.error(path, f"expected {len(args)} {noun}, got {len(value)}")
        return tuple(_convert(a, v, where, (*path, str(i))) for i, (a, v) in enumerate(zip(args, value)))
    if tp is SourceConfig and isinstance(value, str):
        return SourceConfig(uri=value)  # a source given as its URI alone
    if origin is dict:
        if not isinstance(value, Mapping):
            raise where.error(path, f"expected a mapping, got {_kind(value)}")
        key_type, value_type = args
        return {_convert(key_type, k, where, (*path, str(k))): _convert(value_type, v, where, (*path, str(k)))
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, where, path)  # type: ignore[arg-type]
    if tp is bool:
        if not isinstance(value, bool):
            raise where.error(path, f"expected true or false, got {_kind(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.error(path, f"expected a whole number, got {_kind(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise where.error(path, f"expected a number, got {_kind(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise where.error(path, f"expected a string, got {_kind(value)}")
        return str(value)
    raise TypeError(f"config field type {tp!r} is not supported by the loader")  # an edgert bug
