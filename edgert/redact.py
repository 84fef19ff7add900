"""The one place that hides secrets in URIs before they leave the process.

RTSP cameras nearly always take a password in the URI (``rtsp://admin:pw@cam/stream``), and a URI is
shown in many places: log lines (the journal), the unit's ``Description=``, the ``--json`` summary, the
HTML report, the metrics labels, the web preview. :func:`redact` is applied to each of them: the user
info of every URI in a text becomes ``***`` and so does the value of a query option whose name says it is
a secret (``?password=``, ``?token=`` ...). It is deliberately coarse: hiding a harmless ``@`` is fine,
showing a password is not.

Credentials need not be written into a config at all: :func:`expand_env` replaces ``${NAME}`` in a
network URI with the environment variable (a service reads it from its EnvironmentFile, as it does the MQTT
broker's password), so ``rtsp://${CAM1_USER}:${CAM1_PASSWORD}@cam1/stream`` is what configs and unit files
hold, and the expanded URI lives only in the opener.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from edgert.errors import SourceError

__all__ = ["RedactingFilter", "expand_env", "has_literal_secret", "install_log_redaction", "redact", "split_userinfo"]

MASK = "***"

# Where a URI begins: a scheme and "://", not inside a word (a password's "x://" follows a letter or ':').
_SCHEME = re.compile(r"(?<![^\s'\"(\[{<,;=|:>])[A-Za-z][A-Za-z0-9+.-]{1,15}://")
_SECRET_KEYS = frozenset({
    "password", "passwd", "pass", "pwd", "secret", "token", "auth", "key", "apikey", "api_key", "sig",
    "signature", "credential", "credentials", "access_token", "authorization", "session", "sessionid",
    "x-amz-signature", "x-amz-credential", "x-amz-security-token",
})
# An option's value runs to the next separator: not to '#' (an MQTT password may hold it, and the sink
# reads it so), nor to '?' (a second '?' is part of the value).
_QUERY_ITEM = re.compile(r"(?P<key>[^=&;?#\s'\"]+)=(?P<value>[^&;\s'\"]*)")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _secret_key(key: str) -> bool:
    low = key.lower()
    return low in _SECRET_KEYS or low.endswith(("password", "token", "secret", "_key"))


def _option(match: re.Match[str]) -> str:
    key, value = match.group("key"), match.group("value")
    return f"{key}={MASK}" if _secret_key(key) and _ENV.sub("", value) else match.group(0)


def split_userinfo(rest: str) -> tuple[str, str]:
    """``(userinfo, host_and_after)`` of what follows a URI's ``scheme://``; userinfo is '' when there is none.

    The user info ends at the *last* ``@`` of the URI, wherever a ``/``, ``?``, ``#``, blank or quote stands
    before it: a password may hold any of them unencoded (vendors ask for them, and openers that split at the
    last ``@`` accept them), and a URI read the strict way (RFC 3986: the authority ends at the first
    ``/?#``) would show the part of the password after that character as a host or a path.
    """
    at = rest.rfind("@")
    if at < 0:
        return "", rest
    return rest[:at], rest[at + 1:]


def _segments(line: str) -> list[tuple[int, int]]:
    """``(start, end)`` of what follows each ``scheme://`` in ``line``, up to the next URI or the line's end."""
    found = list(_SCHEME.finditer(line))
    return [(m.end(), found[i + 1].start() if i + 1 < len(found) else len(line)) for i, m in enumerate(found)]


def _redact_line(line: str) -> str:
    spans = _segments(line)
    if not spans:
        return line
    out, last = [], 0
    for start, end in spans:
        out.append(line[last:start])
        segment = line[start:end]
        userinfo, after = split_userinfo(segment)
        if userinfo and _ENV.sub("", userinfo).strip(":"):  # user info that only names ${VARS} hides nothing
            out.append(f"{MASK}@")
        elif userinfo or segment.startswith("@"):  # an empty one (webrtc://@:8554) is kept as written
            out.append(userinfo + "@")
        query = after.find("?")
        if query >= 0:
            after = after[:query + 1] + _QUERY_ITEM.sub(_option, after[query + 1:])
        out.append(after)
        last = end
    out.append(line[last:])
    return "".join(out)


def redact(text: Any) -> str:
    """``text`` with the user info and secret query values of every URI in it replaced by ``***``.

    A URI in free text runs to the next URI or the end of its line (a password may hold blanks and quotes), and
    its user info to the last ``@`` in that span: coarse on purpose, as hiding a harmless ``@`` is fine and
    showing a password is not.
    """
    return "".join(_redact_line(line) for line in str(text).splitlines(keepends=True))


def has_literal_secret(uri: str) -> bool:
    """Whether ``uri`` holds a credential written out rather than named as ``${VAR}``."""
    named = _ENV.sub("", uri)  # a ${VAR} is not a secret; what is left of the user info and options may be
    return redact(named) != named


def expand_env(uri: str) -> str:
    """``uri`` with each ``${NAME}`` replaced by that environment variable; an unset one is a one-line error."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        got = os.environ.get(name)
        if got is None:
            raise SourceError(f"{redact(uri)}: refers to ${{{name}}}, which is not set in the environment. Note: "
                              f"a service reads it from its EnvironmentFile (/etc/edgert/NAME.env)")
        return got

    return _ENV.sub(value, uri)


class RedactingFilter(logging.Filter):
    """Rewrites every record's message through :func:`redact` (a driver's error text may quote the URI)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler's own error reporting
            return True
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add :class:`RedactingFilter` to every handler of ``logger`` (default: the root logger), once."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
