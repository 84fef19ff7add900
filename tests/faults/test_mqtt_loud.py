"""MQTT failures are loud: a TLS connection that fails or a broker port that never sends CONNACK is a warning at
once (and again while it lasts) and ``edgert_sink_connected 0`` in ``/metrics``; two processes publishing to one
URI get client ids of their own.

Before: a wrong or missing CA, or a plain client on the TLS port, said nothing during the run even at ``-vv``,
100 % of the messages lost, rc 0; two runs with the same MQTT URI shared one client id and the broker
disconnected each in turn. A real mosquitto with a TLS listener whose CA is made here with ``openssl``.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.conftest import Cli, free_port
from tests.faults.test_late_source import _metric
from tests.io.test_sink_mqtt import MOSQUITTO

pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is not installed (pip install 'edgert[mqtt]')")
OPENSSL = shutil.which("openssl")


def _openssl(folder: Path, *args: str) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=folder, check=True, capture_output=True, timeout=60)


def _throwaway_ca(folder: Path) -> None:
    """A CA, and a server certificate for 127.0.0.1 signed by it: ca.pem, server.pem, server.key."""
    _openssl(folder, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "1", "-subj", "/CN=edgert throwaway CA")
    _openssl(folder, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1")
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    _openssl(folder, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf")


class TlsBroker:
    def __init__(self, folder: Path) -> None:
        self.folder, self.tls_port, self.plain_port = folder, free_port(), free_port()
        _throwaway_ca(folder)
        conf = folder / "mosquitto.conf"
        conf.write_text(f"user {pwd.getpwuid(os.getuid()).pw_name}\nallow_anonymous true\n"
                        f"log_dest file {folder}/mosquitto.log\n"
                        f"listener {self.tls_port} 127.0.0.1\ncafile {folder}/ca.pem\n"
                        f"certfile {folder}/server.pem\nkeyfile {folder}/server.key\n"
                        f"listener {self.plain_port} 127.0.0.1\n", encoding="utf-8")
        assert MOSQUITTO is not None
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.plain_port), timeout=0.2).close()
                break
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, self.log
                time.sleep(0.05)

    @property
    def log(self) -> str:
        path = self.folder / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TlsBroker]:
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    if OPENSSL is None:
        pytest.skip("openssl is not installed (apt-get install openssl)")
    folder = tmp_path / "broker"
    folder.mkdir()
    made = TlsBroker(folder)
    yield made
    made.stop()


def _run(tmp_path: Path, media: dict[str, Path], sink: str, name: str = "p") -> tuple[Cli, str]:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(f"model: {{path: {media['model']}}}\n"
                   f"source: {{uri: '{media['long']}', loop: true, realtime: true}}\n"
                   f"sinks: ['{sink}']\n", encoding="utf-8")
    metrics = f"127.0.0.1:{free_port()}"
    return Cli("run", "--config", str(cfg), "--metrics", metrics), metrics


def _wait_gauge(metrics: str, sink: str, value: float, cli: Cli, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    line = f'edgert_sink_connected{{sink="{sink}"}}'
    while _metric(metrics, line) != value:
        assert time.monotonic() < deadline and cli.proc.poll() is None, (_metric(metrics, line), cli.stderr)
        time.sleep(0.2)


@pytest.mark.parametrize(("case", "why"), [
    ("no ca", "TLS handshake failed: CERTIFICATE_VERIFY_FAILED"),
    ("plain on the TLS port", "no CONNACK"),
])
def test_a_connection_that_does_not_complete_is_loud(tmp_path: Path, media: dict[str, Path], broker: TlsBroker,
                                                     case: str, why: str) -> None:
    scheme = "mqtts" if case == "no ca" else "mqtt"
    sink = f"{scheme}://127.0.0.1:{broker.tls_port}/edgert/cam?connect_timeout=1"
    run, metrics = _run(tmp_path, media, sink)
    try:
        run.wait_for(f"mqtt: no connection to 127.0.0.1:{broker.tls_port}", timeout=30)
        assert why in run.stderr, run.stderr
        _wait_gauge(metrics, sink, 0.0, run)
        queued = _metric(metrics, f'edgert_sink_queued_messages{{sink="{sink}"}}') or 0
        lost = _metric(metrics, f'edgert_sink_lost_messages_total{{sink="{sink}"}}') or 0
        assert queued + lost > 0
        run.signal()
        run.finish(60)
    finally:
        run.kill()
    assert run.stderr.count("mqtt: no connection to") == 1  # said once, not per retry (again after 60 s)


def test_the_throwaway_ca_connects_and_two_processes_keep_their_own_ids(
        tmp_path: Path, media: dict[str, Path], broker: TlsBroker) -> None:
    tls = f"mqtts://127.0.0.1:{broker.tls_port}/edgert/cam?ca={broker.folder}/ca.pem"
    plain = f"mqtt://127.0.0.1:{broker.plain_port}/edgert/door"
    first, m1 = _run(tmp_path, media, tls, "a")
    second, m2 = _run(tmp_path, media, tls, "b")
    third, m3 = _run(tmp_path, media, plain, "c")
    fourth, m4 = _run(tmp_path, media, plain, "d")
    runs = [first, second, third, fourth]
    try:
        for run, metrics, sink in ((first, m1, tls), (second, m2, tls), (third, m3, plain), (fourth, m4, plain)):
            _wait_gauge(metrics, sink, 1.0, run)
        time.sleep(3)  # long enough for a shared id to have thrown one of each pair off
        for run in runs:
            run.signal()
        for run in runs:
            assert run.finish(60)[0] == 0, run.stderr
    finally:
        for run in runs:
            run.kill()
    for run in runs:
        assert "mqtt: lost" not in run.stderr and "no connection" not in run.stderr, run.stderr
    ids = re.findall(r"New client connected from \S+ as (\S+)", broker.log)
    assert len(ids) == 4 and len(set(ids)) == 4, broker.log
    assert "taken over" not in broker.log and "already connected" not in broker.log, broker.log
