"""A stream that does not open fails with one line that says why (refused, 401, 404, timeout), and the C
libraries' own log lines stay out of the way unless -v asks for them."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import re
import socket
import threading
from collections.abc import Iterator

import pytest

from edgert.io.sources.diagnose import why_unreachable
from tests.helpers import ROOT, run_cli

MODEL = ROOT / "edgert" / "demo_data" / "nanodet-m-416-int8w.onnx"


def test_a_refused_rtsp_stream_prints_one_line_naming_the_cause() -> None:
    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    r = run_cli("run", "--model", str(MODEL), "--source", "rtsp://127.0.0.1:9/x", timeout=120)
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("edgert: error: rtsp://127.0.0.1:9/x: cannot open: connection refused"), lines
    loud = run_cli("-v", "run", "--model", str(MODEL), "--source", "rtsp://127.0.0.1:9/x", timeout=120)
    assert "retrying in" in loud.stderr  # -v shows each attempt (and the libraries' own lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def rtsp_server(user: str = "", password: str = "", path: str = "/live") -> Iterator[int]:
    """A loopback RTSP server that answers DESCRIBE: 404 for another path, 401 with a Digest challenge
    when it has a user, 200 for the right answer."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = int(server.getsockname()[1])
    realm, nonce = "cam", "abc123"

    def answer(conn: socket.socket) -> None:
        with conn:
            buf = b""
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    text = head.decode()
                    method, uri = text.split(" ")[:2]
                    cseq = re.search(r"CSeq: (\d+)", text)
                    status = "200 OK"
                    if not uri.endswith(path):
                        status = "404 Not Found"
                    elif user:
                        got = re.search(r'response="([0-9a-f]+)"', text)
                        ha1 = hashlib.md5(f"{user}:{realm}:{password}".encode()).hexdigest()
                        ha2 = hashlib.md5(f"{method}:{uri}".encode()).hexdigest()
                        want = hashlib.md5(f"{ha1}:{nonce}:{ha2}".encode()).hexdigest()
                        if not got or got.group(1) != want:
                            status = "401 Unauthorized"
                    extra = f'WWW-Authenticate: Digest realm="{realm}", nonce="{nonce}"\r\n' if "401" in status else ""
                    conn.sendall(f"RTSP/1.0 {status}\r\nCSeq: {cseq.group(1) if cseq else 0}\r\n{extra}\r\n".encode())

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield port
    finally:
        server.close()


def test_rtsp_answers_are_told_apart() -> None:
    with rtsp_server("admin", "secret") as port:
        base = f"127.0.0.1:{port}"
        assert why_unreachable(f"rtsp://admin:secret@{base}/live") is None
        wrong = why_unreachable(f"rtsp://admin:nope@{base}/live")
        assert wrong is not None and wrong.startswith("401 unauthorized: the server refused the user and password")
        assert "secret" not in wrong and "nope" not in wrong
        none = why_unreachable(f"rtsp://{base}/live")
        assert none is not None and "needs a user and password" in none
        missing = why_unreachable(f"rtsp://admin:secret@{base}/other")
        assert missing is not None and missing.startswith("404 not found")
    assert "connection refused" in (why_unreachable(f"rtsp://127.0.0.1:{_free_port()}/x") or "")


def test_http_status_is_named() -> None:
    handler = http.server.SimpleHTTPRequestHandler
    handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        gone = why_unreachable(f"http://127.0.0.1:{port}/no-such-stream.mjpg")
        assert gone is not None and gone.startswith("404 not found")
    finally:
        server.shutdown()
        server.server_close()


def test_a_silent_port_is_a_timeout() -> None:
    with socket.socket() as quiet:  # listens, never accepts: the connect succeeds, the request gets no answer
        quiet.bind(("127.0.0.1", 0))
        quiet.listen(1)
        reason = why_unreachable(f"rtsp://127.0.0.1:{quiet.getsockname()[1]}/x", timeout=0.5)
    assert reason is not None and "did not answer as rtsp" in reason and "timed out" in reason


def test_what_it_cannot_judge_is_none() -> None:
    assert why_unreachable("/dev/video0") is None
    assert why_unreachable("gst://videotestsrc ! appsink") is None
