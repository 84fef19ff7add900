"""sd_notify over a real datagram socket: paths, abstract names, WATCHDOG_USEC parsing, a vanished socket."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgert.errors import ServiceError
from edgert.service.notify import Notifier, parse_notify_address, watchdog_interval
from tests.service.conftest import NotifyReceiver


def test_ready_status_watchdog_stopping_arrive_as_datagrams(notify_receiver: NotifyReceiver) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": notify_receiver.address})
    assert notifier is not None
    with notifier:
        assert notifier.ready(status="loading done")
        assert notifier.watchdog()
        assert notifier.status("12.0 fps,\n 3.1 W")  # a newline would end the field: it is folded
        assert notifier.stopping()
        assert notifier.extend_timeout(2.5)
    notify_receiver.wait_for("EXTEND_TIMEOUT_USEC")
    got = [m for _, m in notify_receiver.messages]
    assert got == [
        {"READY": "1", "STATUS": "loading done"},
        {"WATCHDOG": "1"},
        {"STATUS": "12.0 fps, 3.1 W"},
        {"STOPPING": "1"},
        {"EXTEND_TIMEOUT_USEC": "2500000"},
    ]


def test_no_notify_socket_means_no_notifier() -> None:
    assert Notifier.from_env({}) is None
    assert Notifier.from_env({"NOTIFY_SOCKET": ""}) is None


def test_abstract_address_becomes_a_leading_nul() -> None:
    assert parse_notify_address("@sd/notify") == b"\0sd/notify"
    assert parse_notify_address("/run/systemd/notify") == "/run/systemd/notify"


@pytest.mark.parametrize("bad", ["relative/notify", "vsock:2:1234"])
def test_unusable_addresses_are_one_line_errors(bad: str) -> None:
    with pytest.raises(ServiceError, match="NOTIFY_SOCKET"):
        Notifier(bad)


def test_a_vanished_socket_is_logged_not_raised(short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier(str(short_dir / "gone.sock"))
    assert notifier.watchdog() is False
    assert notifier.watchdog() is False
    notifier.close()
    warnings = [r for r in caplog.records if "cannot notify systemd" in r.getMessage()]
    assert len(warnings) == 1  # once, not per frame


def test_watchdog_usec_parsing() -> None:
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid())}) == 0.5
    # inherited from a parent: meant for another process
    assert watchdog_interval({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid() + 1)}) is None
    for bad in ({"WATCHDOG_USEC": "soon"}, {"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "5", "WATCHDOG_PID": "x"}):
        with pytest.raises(ServiceError):
            watchdog_interval(bad)
