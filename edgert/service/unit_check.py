"""What may go into a unit file, and the check that the rendered unit says what was meant.

A systemd unit is a line-oriented file: a newline in a value starts a new line (a ``[Service]`` section, an
``ExecStartPre=``), a value ending in a backslash swallows the next line, and ``%`` and ``$`` are expanded. Every
value edgert renders (paths, URIs in the description, user and group names, device rules) is checked here
before rendering; the rendered text is then parsed back the way systemd reads it and compared, line by line and
argument by argument, with what was meant, so that a value no check foresaw is refused rather than written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from edgert.errors import ServiceError
from edgert.redact import redact

__all__ = ["check_name", "check_rendered", "check_value", "parse_unit", "split_exec"]

# C0 controls and DEL; and the characters Python (not systemd) reads as line ends, which would make a file
# that edgert's own readers see differently from systemd.
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
# systemd's portable user and group names (the "strict" rules of systemd's user-record docs).
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,30}$")
_COMMENTS = ("#", ";")


def check_value(field: str, value: str) -> str:
    """``value`` unchanged, or a one-line ServiceError naming ``field`` when it cannot stay on one unit line."""
    bad = _CONTROL.search(value)
    if bad:
        raise ServiceError(f"{field} {redact(repr(value))}: holds a control character ({bad.group()!r}), which "
                           "would start a new line of the unit file; rename it")
    if value.endswith("\\"):
        raise ServiceError(f"{field} {redact(repr(value))}: ends with a backslash, which would join the next line "
                           "of the unit file to it; rename it")
    return value


def check_name(field: str, value: str) -> str:
    """A user or group name systemd accepts everywhere: letters, digits, '_' and '-', not starting with a digit."""
    if not _USER.match(value):
        raise ServiceError(f"{field} {value!r}: not a user or group name (letters, digits, '_' and '-', starting "
                           "with a letter or '_', at most 31 characters)")
    return value


def parse_unit(text: str) -> list[tuple[str, str, str]]:
    """``(section, key, value)`` of every setting of a unit file, read as systemd's parser reads it: lines split
    at ``\\n`` only, comments skipped, a trailing backslash joining the next line (with a blank)."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in text.split("\n"):
        line = raw.strip()
        if not pending and (not line or line.startswith(_COMMENTS)):
            continue
        if pending and line.startswith(_COMMENTS):
            continue  # systemd skips comment lines inside a continued line
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        out.append((section, key.strip() if sep else "", value.strip() if sep else line))
    if pending:
        out.append((section, "", pending))
    return out


def split_exec(value: str) -> list[str]:
    """The argv systemd runs for an ``Exec*=`` value edgert wrote: blanks split words, double quotes group them
    (with ``\\\\`` and ``\\"`` inside), then ``%%`` stands for ``%`` and, in the arguments, ``$$`` for ``$``."""
    words: list[str] = []
    i, n = 0, len(value)
    while i < n:
        if value[i].isspace():
            i += 1
            continue
        word: list[str] = []
        quoted = False
        while i < n and (quoted or not value[i].isspace()):
            ch = value[i]
            if ch == '"':
                quoted = not quoted
            elif ch == "\\" and i + 1 < n:
                i += 1
                word.append(value[i])
            else:
                word.append(ch)
            i += 1
        text = "".join(word).replace("%%", "%")
        words.append(text.replace("$$", "$") if words else text)  # no $VARIABLES in the executable's name
    return words


def check_rendered(text: str, meant: Sequence[tuple[str, str, str]], exec_argv: dict[str, list[list[str]]]) -> None:
    """Raise when the unit ``text`` does not read back as ``meant`` (every setting, in order) or an ``Exec*=``
    line does not split into the arguments of ``exec_argv`` (key -> argv of each such line)."""
    read = parse_unit(text)
    for i, (got, want) in enumerate(zip(read, meant)):
        if got != want:
            raise ServiceError(f"the rendered unit's setting {i + 1} reads as {redact(got)} instead of "
                               f"{redact(want)}: a value holds characters a unit file cannot carry")
    if len(read) != len(meant):
        raise ServiceError(f"the rendered unit has {len(read)} settings instead of {len(meant)}: a value holds "
                           "characters a unit file cannot carry")
    for key, argvs in exec_argv.items():
        lines = [split_exec(value) for _, k, value in read if k == key]
        if lines != argvs:
            raise ServiceError(f"the rendered {key}= reads as {redact(lines)} instead of {redact(argvs)}: an "
                               "argument holds characters a unit file cannot carry")
