"""A real sd_notify receiver: a datagram socket the test owns, standing in for systemd's."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


class NotifyReceiver:
    """Binds an AF_UNIX datagram socket (a path, or an abstract name) and collects every datagram."""

    def __init__(self, address: str) -> None:
        self.address = address  # the NOTIFY_SOCKET value
        bind_to: str | bytes = b"\0" + address[1:].encode() if address.startswith("@") else address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(bind_to)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, OSError):
                continue
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def with_key(self, key: str) -> list[tuple[float, dict[str, str]]]:
        return [(t, m) for t, m in list(self.messages) if key in m]

    def wait_for(self, key: str, timeout: float = 30.0, count: int = 1) -> list[tuple[float, dict[str, str]]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.with_key(key)
            if len(found) >= count:
                return found
            time.sleep(0.02)
        raise AssertionError(f"no {count}x {key} within {timeout}s; got {[m for _, m in self.messages]}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
        if not self.address.startswith("@"):
            Path(self.address).unlink(missing_ok=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a socket path must fit in 108 bytes, pytest's tmp_path may not."""
    path = Path(tempfile.mkdtemp(prefix="edgert-sd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["path", "abstract"])
def notify_receiver(request: pytest.FixtureRequest, short_dir: Path) -> Iterator[NotifyReceiver]:
    if request.param == "path":
        address = str(short_dir / "notify.sock")
    else:
        address = f"@edgert-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    receiver = NotifyReceiver(address)
    yield receiver
    receiver.close()


@pytest.fixture
def path_receiver(short_dir: Path) -> Iterator[NotifyReceiver]:
    receiver = NotifyReceiver(str(short_dir / "notify.sock"))
    yield receiver
    receiver.close()
