"""SystemdObserver driven by a real PipelineStats and a real socket; time comes from a clock the test steps."""

from __future__ import annotations

import time

import numpy as np

from edgert.service.notify import Notifier
from edgert.service.watchdog import SystemdObserver, status_line
from edgert.stats import STAGES, PipelineStats
from tests.service.conftest import NotifyReceiver


class SteppedClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _frame(stats: PipelineStats) -> None:
    stats.record_frame(np.full(len(STAGES), 0.01), detections=2)


def test_ready_then_pings_at_half_the_watchdog_period_then_stopping(path_receiver: NotifyReceiver) -> None:
    clock = SteppedClock()
    observer = SystemdObserver(Notifier(path_receiver.address), watchdog_s=2.0, clock=clock)
    stats = PipelineStats()
    stats.watts = 4.25
    observer.on_frame(stats)  # before on_start: not ready, nothing sent
    observer.on_start({"model": "nanodet.onnx", "backend": "onnxruntime"})
    for _ in range(40):  # 40 frames at 8 fps = 5 s (steps exact in binary): a ping every 1 s
        clock.now += 0.125
        _frame(stats)
        observer.on_frame(stats)
    observer.on_stop({"frames": stats.frames})
    observer.close()
    path_receiver.wait_for("STOPPING")
    # STOPPING and the final STATUS are two datagrams: wait for the last one too before reading the list.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
            m.get("STATUS", "").startswith("stopped after") for _, m in list(path_receiver.messages)):
        time.sleep(0.02)
    msgs = [m for _, m in path_receiver.messages]
    assert msgs[0]["READY"] == "1" and "nanodet.onnx on onnxruntime" in msgs[0]["STATUS"]
    pings = [m for m in msgs if "WATCHDOG" in m]
    assert len(pings) == 1 + 5 == observer.pings + 1  # with READY, then every 1.0 s over 5 s
    assert all("fps" in m["STATUS"] and "4.2 W" in m["STATUS"] for m in pings[1:])
    assert msgs[-2]["STOPPING"] == "1"
    assert msgs[-1]["STATUS"] == "stopped after 40 frames"


def test_a_stalled_pipeline_sends_no_pings(path_receiver: NotifyReceiver) -> None:
    clock = SteppedClock()
    observer = SystemdObserver(Notifier(path_receiver.address), watchdog_s=1.0, clock=clock)
    stats = PipelineStats()
    observer.on_start({})
    clock.now += 0.6
    _frame(stats)
    observer.on_frame(stats)
    path_receiver.wait_for("WATCHDOG", count=2)
    clock.now += 60.0  # a minute with no frame: nobody calls on_frame, so nothing is sent
    observer.close()
    assert len(path_receiver.with_key("WATCHDOG")) == 2


def test_stop_requested_says_stopping_once(path_receiver: NotifyReceiver) -> None:
    observer = SystemdObserver(Notifier(path_receiver.address), watchdog_s=None)
    observer.on_start({})
    observer.on_stop_requested("SIGTERM")
    observer.on_frame(PipelineStats())  # frames still draining: no pings, no status after STOPPING
    observer.on_stop({})
    observer.close()
    path_receiver.wait_for("STOPPING")
    assert len(path_receiver.with_key("STOPPING")) == 1


def test_status_line_without_a_power_meter() -> None:
    stats = PipelineStats()
    assert status_line(stats) == "0.0 fps, power n/a, 0 frames, 0 dropped"
    stats.set_drops("stale", 3)
    stats.watts = 7.0
    assert status_line(stats) == "0.0 fps, 7.0 W, 0 frames, 3 dropped"
