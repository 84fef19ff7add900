"""Issue 25, case 9: clients that trickle their headers (slowloris) cannot hold the preview or the metrics.

The real CLI serves the web preview and the metrics endpoint; 40 clients per server send a request line
and then one header line every second, reconnecting whenever they are cut, for as long as the test runs.
A legitimate GET still gets its answer.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from tests.faults.conftest import Cli, free_port, http_get

TRICKLERS = 40


class Tricklers:
    def __init__(self, port: int, count: int = TRICKLERS) -> None:
        self.port = port
        self.stop = threading.Event()
        self.connects = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                # from another address than the legitimate GET's (both loopback): one address may hold only half
                # of a server's connections, so the attacker's own address is what it exhausts
                with socket.create_connection(("127.0.0.1", self.port), timeout=5,
                                              source_address=("127.0.0.2", 0)) as s:
                    self.connects += 1
                    s.sendall(b"GET / HTTP/1.1\r\n")
                    while not self.stop.wait(1.0):
                        s.sendall(b"X-Trickle: 1\r\n")  # never the blank line that ends the headers
            except OSError:  # cut by the server (or refused while it was full): come back at once
                time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)


def _eventually_ok(url: str, tries: int = 60) -> int:
    """The status of the first GET that is not a 503 (or the last 503), one try every half second."""
    status = 0
    for _ in range(tries):
        try:
            status, _ = http_get(url, timeout=5)
        except OSError:
            status = 0
        if status == 200:
            return status
        time.sleep(0.5)
    return status


def test_a_get_succeeds_while_40_clients_trickle_headers(tmp_path: Path, media: dict[str, Path]) -> None:
    preview, metrics = free_port(), free_port()
    run = Cli("run", "--model", str(media["model"]), "--source", str(media["long"]), "--loop",
              "--sink", f"http://127.0.0.1:{preview}", "--metrics", f"127.0.0.1:{metrics}")
    tricklers: list[Tricklers] = []
    try:
        run.wait_for("metrics at")
        assert _eventually_ok(f"http://127.0.0.1:{preview}/stats.json") == 200
        tricklers = [Tricklers(preview), Tricklers(metrics)]
        time.sleep(3.0)  # every slot is taken by now
        assert _eventually_ok(f"http://127.0.0.1:{preview}/stats.json") == 200
        assert _eventually_ok(f"http://127.0.0.1:{metrics}/metrics") == 200
        assert all(t.connects >= TRICKLERS for t in tricklers)
    finally:
        for t in tricklers:
            t.close()
        run.signal()
        code, _ = run.finish(30)
        run.kill()
    assert code == 0, run.stderr
