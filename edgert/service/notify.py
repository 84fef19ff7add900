"""sd_notify on the socket protocol itself: no libsystemd, no extra package.

systemd hands a ``Type=notify`` service the address of a datagram socket in ``NOTIFY_SOCKET``: a path,
or a name in Linux's abstract namespace written with a leading ``@``. Each message is one datagram of
newline-separated ``KEY=VALUE`` lines (``READY=1``, ``WATCHDOG=1``, ``STATUS=...``, ``STOPPING=1``).
systemd learns the sender's PID from the kernel (SCM_CREDENTIALS), so any thread of the main process
may send when the unit says ``NotifyAccess=main``.

``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, when set, naming the process it is meant for) tells the
service how often systemd expects ``WATCHDOG=1``; :func:`watchdog_interval` parses it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping

from edgert.errors import ServiceError

__all__ = ["Notifier", "parse_notify_address", "watchdog_interval"]

log = logging.getLogger(__name__)


def parse_notify_address(value: str) -> str | bytes:
    """The ``sendto`` address for a ``NOTIFY_SOCKET`` value: a path, or abstract bytes for ``@name``."""
    if value.startswith("@"):
        # Abstract namespace: a leading NUL byte instead of '@', and no terminating NUL.
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    if value.startswith("vsock:"):
        raise ServiceError(f"NOTIFY_SOCKET={value}: AF_VSOCK notify sockets (VMs) are not supported by edgert")
    raise ServiceError(f"NOTIFY_SOCKET={value!r}: expected an absolute socket path or an @abstract name")


def watchdog_interval(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between systemd's watchdog deadlines, or None when no watchdog is asked of this process.

    ``WATCHDOG_PID`` set to another PID means the variable was inherited and is not ours (sd_watchdog_enabled
    applies the same rule).
    """
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    try:
        value = int(usec)
    except ValueError:
        raise ServiceError(f"WATCHDOG_USEC={usec!r}: expected microseconds as a whole number") from None
    if value <= 0:
        raise ServiceError(f"WATCHDOG_USEC={usec!r}: expected a positive number of microseconds")
    owner = env.get("WATCHDOG_PID")
    if owner:
        try:
            owner_pid = int(owner)
        except ValueError:
            raise ServiceError(f"WATCHDOG_PID={owner!r}: expected a process id") from None
        if owner_pid != (os.getpid() if pid is None else pid):
            return None
    return value / 1_000_000


class Notifier:
    """Sends sd_notify messages to one address. Thread-safe; send failures are logged, never raised.

    A service must not die because its supervisor's socket went away for a moment; if the socket is
    really gone, systemd's own timeouts take over.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._target = parse_notify_address(address)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier | None:
        """A notifier for ``$NOTIFY_SOCKET``, or None when the process is not run by systemd as notify."""
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET")
        return cls(address) if address else None

    def send(self, *lines: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; True when the kernel accepted it."""
        for line in lines:
            if "=" not in line or "\n" in line:
                raise ValueError(f"not a one-line KEY=VALUE notify field: {line!r}")  # an edgert bug
        payload = "\n".join(lines).encode("utf-8", "replace")
        with self._lock:
            try:
                self._sock.sendto(payload, self._target)
            except OSError as exc:
                if not self._warned:
                    log.warning("cannot notify systemd at %s: %s", self.address, exc)
                    self._warned = True
                return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def watchdog(self, status: str | None = None) -> bool:
        return self.send("WATCHDOG=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={_one_line(text)}")

    def stopping(self, status: str | None = None) -> bool:
        return self.send("STOPPING=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more time in the current start or stop phase (``EXTEND_TIMEOUT_USEC``)."""
        return self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def close(self) -> None:
        with self._lock:
            self._sock.close()

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _one_line(text: str) -> str:
    return " ".join(text.split())
