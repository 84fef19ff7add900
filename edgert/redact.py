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

__all__ = ["RedactingFilter", "expand_env", "has_literal_secret", "install_log_redaction", "redact"]

MASK = "***"

# A scheme and everything up to the next blank or quote: the span one URI can take in free text.
_URI = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{1,15}://)(?P<rest>[^\s'\"<>]*)")
_SECRET_KEYS = frozenset({
    "password", "passwd", "pass", "pwd", "secret", "token", "auth", "key", "apikey", "api_key", "sig",
    "signature", "credential", "credentials", "access_token", "authorization", "session", "sessionid",
    "x-amz-signature", "x-amz-credential", "x-amz-security-token",
})
_QUERY_ITEM = re.compile(r"(?P<key>[^=&;#]+)=(?P<value>[^&;#]*)")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _secret_key(key: str) -> bool:
    low = key.lower()
    return low in _SECRET_KEYS or low.endswith(("password", "token", "secret", "_key"))


def _option(match: re.Match[str]) -> str:
    key, value = match.group("key"), match.group("value")
    return f"{key}={MASK}" if _secret_key(key) and _ENV.sub("", value) else match.group(0)


def _one(match: re.Match[str]) -> str:
    scheme, rest = match.group("scheme"), match.group("rest")
    cut = len(rest)
    for ch in "?#":
        at = rest.find(ch)
        if at >= 0:
            cut = min(cut, at)
    head, tail = rest[:cut], rest[cut:]
    at = head.rfind("@")  # the last one: a password may hold '@' or '/' unencoded
    if at >= 0 and _ENV.sub("", head[:at]).strip(":"):  # user info that only names ${VARS} hides nothing
        head = f"{MASK}@{head[at + 1:]}"
    if tail.startswith("?"):
        tail = "?" + _QUERY_ITEM.sub(_option, tail[1:])
    return scheme + head + tail


def redact(text: Any) -> str:
    """``text`` with the user info and secret query values of every URI in it replaced by ``***``."""
    return _URI.sub(_one, str(text))


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
