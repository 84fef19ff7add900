"""Why a network stream did not open, in words: OpenCV's ``VideoCapture`` answers only "not opened" (FFmpeg's
reason goes to its own log, which edgert keeps quiet by default), so after the last attempt the source asks
the server itself, once.

:func:`why_unreachable` resolves the host (DNS), connects to the port (refused, timed out) and, for
``rtsp://`` and ``http(s)://``, asks for the stream (RTSP ``DESCRIBE``, with Digest or Basic authentication
when the URI has a user; HTTP ``GET``) to tell 401 (user or password) and 404 (path) apart. It never raises:
None when everything it can check answered, or the scheme is not one it knows.
"""

from __future__ import annotations

import base64
import hashlib
import re
import socket
import ssl
import urllib.parse

__all__ = ["why_unreachable"]

DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "http": 80, "https": 443, "rtmp": 1935}


def why_unreachable(uri: str, timeout: float = 3.0) -> str | None:
    """The reason ``uri`` cannot be reached (no credentials in it), or None."""
    try:
        parts = urllib.parse.urlsplit(uri)
        host, port = parts.hostname, parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    if not host or port is None:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return f"DNS: cannot resolve host {host}"
    family, _, _, _, address = infos[0]
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        return f"cannot make a socket ({exc.strerror or exc})"
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except ConnectionRefusedError:
            return f"connection refused by {host}:{port} (nothing listens there)"
        except socket.timeout:
            return f"no answer from {host}:{port} within {timeout:g} s (timeout: a firewall, or the wrong address)"
        except OSError as exc:
            return f"cannot connect to {host}:{port} ({exc.strerror or exc})"
        scheme = parts.scheme.lower()
        try:
            if scheme in ("https", "rtsps"):
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            if scheme.startswith("rtsp"):
                return _rtsp_status(sock, parts)
            if scheme.startswith("http"):
                return _http_status(sock, parts)
        except (OSError, ValueError) as exc:
            return f"{host}:{port} accepts connections but did not answer as {scheme} ({exc})"
    return None


def _clean(parts: urllib.parse.SplitResult) -> str:
    """The URI without user and password (what a request line carries)."""
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))


def _ask(sock: socket.socket, request: str) -> tuple[int, dict[str, str]]:
    sock.sendall(request.encode("latin-1"))
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    lines = head.split("\r\n")
    match = re.match(r"(?:RTSP|HTTP)/\d(?:\.\d)? (\d{3})", lines[0] if lines else "")
    if not match:
        raise ValueError(f"unexpected reply {lines[0][:60]!r}" if lines and lines[0] else "no reply")
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(match.group(1)), headers


def _authorization(challenge: str, method: str, uri: str, user: str, password: str) -> str | None:
    if challenge.lower().startswith("basic"):
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    if not challenge.lower().startswith("digest"):
        return None
    fields = dict(re.findall(r'(\w+)="?([^",]*)"?', challenge[6:]))
    realm, nonce = fields.get("realm", ""), fields.get("nonce", "")
    ha1 = hashlib.md5(f"{user}:{realm}:{password}".encode()).hexdigest()
    ha2 = hashlib.md5(f"{method}:{uri}".encode()).hexdigest()
    response = hashlib.md5(f"{ha1}:{nonce}:{ha2}".encode()).hexdigest()
    return (f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{uri}", '
            f'response="{response}"')


def _meaning(code: int, has_user: bool) -> str | None:
    if code == 401:
        return ("401 unauthorized: the server refused the user and password" if has_user else
                "401 unauthorized: the stream needs a user and password (rtsp://USER:PASSWORD@host/...)")
    if code == 403:
        return "403 forbidden"
    if code == 404:
        return "404 not found: the server has no stream at this path"
    if code >= 400:
        return f"the server answered {code}"
    return None


def _rtsp_status(sock: socket.socket, parts: urllib.parse.SplitResult) -> str | None:
    uri = _clean(parts)
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    request = f"DESCRIBE {uri} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\nUser-Agent: edgert\r\n"
    code, headers = _ask(sock, request + "\r\n")
    if code == 401 and user:
        auth = _authorization(headers.get("www-authenticate", ""), "DESCRIBE", uri, user, password)
        if auth:
            code, headers = _ask(sock, request.replace("CSeq: 1", "CSeq: 2") + f"Authorization: {auth}\r\n\r\n")
    return _meaning(code, bool(user))


def _http_status(sock: socket.socket, parts: urllib.parse.SplitResult) -> str | None:
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    host = parts.hostname or ""
    auth = ""
    if parts.username:
        token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        auth = "Authorization: Basic " + base64.b64encode(token.encode()).decode() + "\r\n"
    code, _ = _ask(sock, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: edgert\r\n{auth}"
                         "Connection: close\r\n\r\n")
    return _meaning(code, bool(parts.username))
