"""The rules people configure: counting lines and zones from the command line, checked against the frame.

``--line NAME:x1,y1,x2,y2[:in|out|both][:classes=A,B]`` and ``--zone NAME:x1,y1,x2,y2,x3,y3,...
[:crowded_at=N][:classes=A,B]`` give a first try without a YAML file; they become the same
:class:`~edgert.config.LineConfig` / :class:`~edgert.config.ZoneConfig` as the ``analytics:`` section.

Coordinates are frame pixels, or fractions of the frame's width and height when every coordinate of the
line or zone lies within 0..1 (``door:0.5,0,0.5,1`` is the vertical middle of any frame). What can only be
checked once the source and the model are open (a point off the frame, a class the model does not have) is
checked by :func:`edgert.analytics.table.resolve_rules` (with :func:`on_frame` and :func:`check_classes`),
before any sink opens; every bad rule is one line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgert.config import FieldError, LineConfig, ZoneConfig
from edgert.errors import ConfigError

__all__ = ["check_classes", "is_normalized", "on_frame", "parse_line", "parse_zone"]

_DIRECTIONS = ("in", "out", "both")


def _numbers(flag: str, name: str, text: str) -> list[float]:
    values: list[float] = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise ConfigError(f"{flag} {name}: {part.strip()!r} is not a number. Note: coordinates are "
                              "x1,y1,x2,y2,... in pixels or 0..1 fractions of the frame") from None
        if not math.isfinite(v):
            raise ConfigError(f"{flag} {name}: coordinates must be finite numbers, got {part.strip()}")
        values.append(v)
    if len(values) % 2:
        raise ConfigError(f"{flag} {name}: {len(values)} coordinates; expected x,y pairs")
    return values


def _split(flag: str, text: str, form: str) -> tuple[str, list[float], list[str]]:
    parts = text.split(":")
    if len(parts) < 2 or not parts[0].strip() or not parts[1].strip():
        raise ConfigError(f"{flag} {text!r}: expected {form}")
    name = parts[0].strip()
    return name, _numbers(flag, name, parts[1]), [p.strip() for p in parts[2:]]


def _classes(flag: str, name: str, value: str) -> tuple[str, ...]:
    classes = tuple(c.strip() for c in value.split(",") if c.strip())
    if not classes:
        raise ConfigError(f"{flag} {name}: classes= names no class")
    return classes


def _build(flag: str, name: str, make: type, **kwargs: object) -> object:
    try:
        return make(name=name, **kwargs)
    except FieldError as exc:
        raise ConfigError(f"{flag} {name}: {exc.field_name}: {exc.message}") from None


def parse_line(text: str) -> LineConfig:
    """``NAME:x1,y1,x2,y2[:in|out|both][:classes=A,B]`` as a line; a one-line ConfigError when it is not one."""
    flag, form = "--line", "NAME:x1,y1,x2,y2[:in|out|both][:classes=A,B]"
    name, values, options = _split(flag, text, form)
    if len(values) != 4:
        raise ConfigError(f"{flag} {name}: a line takes 4 coordinates x1,y1,x2,y2, got {len(values)}")
    direction = "both"
    classes: tuple[str, ...] | None = None
    for option in options:
        if option in _DIRECTIONS:
            direction = option
        elif option.startswith("classes="):
            classes = _classes(flag, name, option[len("classes="):])
        else:
            raise ConfigError(f"{flag} {name}: unknown option {option!r}. Note: expected a direction (in, out, "
                              "both) or classes=A,B")
    points = ((values[0], values[1]), (values[2], values[3]))
    line = _build(flag, name, LineConfig, points=points, direction=direction, classes=classes)
    assert isinstance(line, LineConfig)
    return line


def parse_zone(text: str) -> ZoneConfig:
    """``NAME:x1,y1,x2,y2,x3,y3,...[:crowded_at=N][:classes=A,B]`` as a zone; one-line ConfigError otherwise."""
    flag, form = "--zone", "NAME:x1,y1,x2,y2,x3,y3,...[:crowded_at=N][:classes=A,B]"
    name, values, options = _split(flag, text, form)
    if len(values) < 6:
        raise ConfigError(f"{flag} {name}: a zone takes at least 3 points (6 coordinates), got {len(values)}")
    crowded_at: int | None = None
    classes: tuple[str, ...] | None = None
    for option in options:
        if option.startswith("crowded_at="):
            value = option[len("crowded_at="):]
            if not value.isdigit():
                raise ConfigError(f"{flag} {name}: crowded_at: expected a whole number of tracks >= 1, got {value!r}")
            crowded_at = int(value)
        elif option.startswith("classes="):
            classes = _classes(flag, name, option[len("classes="):])
        else:
            raise ConfigError(f"{flag} {name}: unknown option {option!r}. Note: expected crowded_at=N or "
                              "classes=A,B")
    polygon = tuple((values[i], values[i + 1]) for i in range(0, len(values), 2))
    zone = _build(flag, name, ZoneConfig, polygon=polygon, crowded_at=crowded_at, classes=classes)
    assert isinstance(zone, ZoneConfig)
    return zone


def is_normalized(points: Sequence[Sequence[float]]) -> bool:
    """Whether ``points`` are fractions of the frame: every coordinate within 0..1."""
    return all(0.0 <= float(v) <= 1.0 for p in points for v in p)


def on_frame(kind: str, name: str, points: Sequence[Sequence[float]], width: int, height: int,
              source: str) -> tuple[tuple[float, float], ...]:
    """``points`` in pixels (scaled when normalised); a ConfigError naming the first point off the frame."""
    if is_normalized(points):
        return tuple((float(x) * width, float(y) * height) for x, y in points)
    for x, y in points:
        if not (0.0 <= x <= width and 0.0 <= y <= height):
            raise ConfigError(f"analytics: {kind} {name}: point ({x:g}, {y:g}) is off the {width}x{height} frame "
                              f"of source {source}. Note: give pixels within the frame, or 0..1 fractions")
    return tuple((float(x), float(y)) for x, y in points)


def check_classes(kind: str, name: str, classes: tuple[str, ...] | None, names: Sequence[str]) -> None:
    if classes is None:
        return
    for c in classes:
        if c in names or (c.isdigit() and (not names or int(c) < len(names))):
            continue
        shown = ", ".join(list(names)[:8]) + (", ..." if len(names) > 8 else "")
        known = f"the model's classes are {shown} (or ids 0..{len(names) - 1})" if names else \
            "the model has no class names: give class ids"
        raise ConfigError(f"analytics: {kind} {name}: unknown class {c!r}. Note: {known}")
