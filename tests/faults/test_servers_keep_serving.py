"""The web preview and /metrics keep serving the people they are for.

Before: a reconnecting slowloris of 20 sockets held ``/metrics`` at 100 % 503; neither server checked ``Host``
(a DNS-rebinding page could read camera frames); ``--metrics :PORT`` bound every interface without a word; and
``--sink http://127.0.0.1:0`` was announced as ``:0``. The real CLI, real sockets; the attacker connects from
127.0.0.2, the scraper from 127.0.0.1 (both loopback).
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from pathlib import Path

from tests.faults.conftest import Cli, free_port


def _config(tmp_path: Path, media: dict[str, Path], preview: str) -> Path:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   f"source: {{uri: '{media['long']}', loop: true, realtime: true}}\n"
                   f"sinks: ['{preview}']\n", encoding="utf-8")
    return cfg


def _get(port: int, path: str, host: str | None = None, source: str = "127.0.0.1") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        conn.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        response.read(100)
        return int(response.status)
    finally:
        conn.close()


def test_the_real_port_and_the_host_check(tmp_path: Path, media: dict[str, Path]) -> None:
    metrics = free_port()
    run = Cli("run", "--config", str(_config(tmp_path, media, "http://127.0.0.1:0")),
              "--metrics", f"127.0.0.1:{metrics}", env={"EDGERT_HTTP_HOSTS": "cam.example"})
    try:
        run.wait_for("web preview at http://127.0.0.1:")
        found = re.search(r"web preview at http://127\.0\.0\.1:(\d+)/", run.stderr)
        assert found is not None and found.group(1) != "0", run.stderr
        preview = int(found.group(1))
        assert _get(preview, "/stats.json") == 200
        assert _get(preview, "/stats.json", host=f"127.0.0.1:{preview}") == 200
        assert _get(preview, "/stats.json", host=f"cam.example:{preview}") == 200  # named in EDGERT_HTTP_HOSTS
        assert _get(preview, "/", host=f"rebind.attacker.example:{preview}") == 421
        assert _get(preview, "/stream", host="rebind.attacker.example") == 421
        assert _get(metrics, "/metrics", host=f"localhost:{metrics}") == 200
        assert _get(metrics, "/metrics", host="rebind.attacker.example") == 421
        run.signal()
        code, _ = run.finish(60)
    finally:
        run.kill()
    assert code == 0, run.stderr


def test_metrics_on_every_interface_is_said(tmp_path: Path, media: dict[str, Path]) -> None:
    port = free_port()
    run = Cli("run", "--config", str(_config(tmp_path, media, f"jsonl://{tmp_path}/e.jsonl")),
              "--metrics", f"0.0.0.0:{port}")
    try:
        run.wait_for("metrics listen on every interface")
        run.signal()
        run.finish(60)
    finally:
        run.kill()


def _slowloris(port: int, stop: threading.Event, sockets: int = 20) -> None:
    """``sockets`` connections from 127.0.0.2 that trickle a request forever, each reopened as soon as it is cut."""
    def one() -> None:
        while not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=("127.0.0.2", 0))
            except OSError:
                time.sleep(0.05)
                continue
            try:
                s.sendall(b"GET /metrics HTTP/1.1\r\n")
                while not stop.is_set():
                    s.sendall(b"X-a: b\r\n")
                    time.sleep(0.5)
            except OSError:
                pass  # cut (or refused): at once again
            finally:
                s.close()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(sockets)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(5)


def test_a_reconnecting_slowloris_does_not_starve_the_scraper(tmp_path: Path, media: dict[str, Path]) -> None:
    port = free_port()
    run = Cli("run", "--config", str(_config(tmp_path, media, f"jsonl://{tmp_path}/e.jsonl")),
              "--metrics", f"127.0.0.1:{port}")
    stop = threading.Event()
    attack = threading.Thread(target=_slowloris, args=(port, stop), daemon=True)
    answers: list[int] = []
    try:
        run.wait_for("metrics at")
        attack.start()
        time.sleep(1.0)  # every slot the attacker can take is taken
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            try:
                answers.append(_get(port, "/metrics"))
            except OSError:
                answers.append(0)
            time.sleep(0.2)
        run.signal()
        code, _ = run.finish(60)
    finally:
        stop.set()
        attack.join(10)
        run.kill()
    assert code == 0, run.stderr
    served = answers.count(200) / len(answers)
    assert served >= 0.9, answers
