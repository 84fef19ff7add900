"""The sampler thread: watts, joules and millijoules per frame from real threads and real meters."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from edgert.power import NullMeter, PowerSampler, SimulatedBoard
from edgert.power.clock import VirtualClock
from edgert.power.rapl import RaplMeter
from tests.power import boards


def _run_board(board: SimulatedBoard, sampler: PowerSampler, fps: float, seconds: float) -> None:
    """A pipeline of ``fps`` frames per second (clock time) on the board, counting frames on the sampler."""
    clock = board.clock
    period = 1.0 / fps
    next_t = clock.now()
    end = next_t + seconds
    while clock.now() < end:
        board.process_frame()
        sampler.frame_done()
        next_t += period
        clock.sleep(next_t - clock.now())


def test_energy_per_frame_on_a_simulated_board() -> None:
    clock = VirtualClock()
    clock.register()  # this thread drives the frames: time waits for it
    board = SimulatedBoard(idle_w=2.0, joules_per_frame=0.25, max_fps=100, lag_s=0.05, noise_w=0.02, clock=clock)
    with PowerSampler(board, hz=20) as s:
        _run_board(board, s, fps=40, seconds=20)
    out = s.summary()
    expected_w = 2.0 + 0.25 * 40  # 12 W once the lag has settled (0.05 s of 20 s)
    assert out["avg_w"] == pytest.approx(expected_w, rel=0.05)
    assert out["energy_j"] == pytest.approx(out["avg_w"] * out["duration_s"], rel=1e-6)
    assert out["peak_w"] >= out["avg_w"]
    # mJ per frame = watts / fps
    assert out["mj_per_frame"] == pytest.approx(expected_w / 40 * 1000, rel=0.05)
    assert out["fps"] == pytest.approx(40, rel=0.05)
    assert set(out["per_rail"]) == {"VDD_IN", "VDD_CPU_GPU_CV"}
    assert out["per_rail"]["VDD_IN"]["avg_w"] == pytest.approx(out["avg_w"])
    assert out["samples"] > 300
    assert out["errors"] == 0


def test_moving_average_follows_the_load() -> None:
    clock = VirtualClock()
    clock.register()
    board = SimulatedBoard(idle_w=1.0, joules_per_frame=0.1, max_fps=100, lag_s=0.05, noise_w=0.0, clock=clock)
    with PowerSampler(board, hz=20) as s:
        clock.sleep(3)
        idle = s.moving_average(1.0)
        _run_board(board, s, fps=50, seconds=4)
        busy = s.moving_average(1.0)
        busy_part = s.moving_average(1.0, "VDD_CPU_GPU_CV")
    assert idle == pytest.approx(1.0, abs=0.01)
    assert busy == pytest.approx(6.0, rel=0.05)
    assert busy_part == pytest.approx(5.5, rel=0.05)


def test_hardware_energy_counter_is_preferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A RAPL tree whose counter a writer thread advances at 5 W: the sampler's joules match it."""
    root = tmp_path / "root"
    boards.rapl(root, package_uj=0)
    monkeypatch.setenv("EDGERT_SYSROOT", str(root))
    energy = root / "sys/class/powercap/intel-rapl:0/energy_uj"
    stop = threading.Event()
    t0 = time.monotonic()

    def write() -> None:
        tmp = energy.with_name("energy_uj.tmp")
        while not stop.is_set():
            tmp.write_text(f"{int((time.monotonic() - t0) * 5.0 * 1e6)}\n")
            tmp.replace(energy)  # atomic, as a sysfs read always is
            time.sleep(0.005)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        with PowerSampler(RaplMeter(), hz=20) as s:
            for _ in range(30):
                s.frame_done()
                time.sleep(0.02)
    finally:
        stop.set()
        writer.join()
    out = s.summary()
    assert out["avg_w"] == pytest.approx(5.0, rel=0.1)
    assert out["per_rail"]["package-0"]["energy_j"] == pytest.approx(out["energy_j"])
    assert out["frames_measured"] == 30
    assert out["mj_per_frame"] == pytest.approx(out["energy_j"] * 1000 / 30)


def test_null_meter_still_counts_frames_and_says_why() -> None:
    with PowerSampler(NullMeter("no INA3221, no NVML"), hz=10) as s:
        s.add_frames(5)
        s.frame_done()
    out = s.summary()
    assert out["available"] is False
    assert out["avg_w"] is None and out["energy_j"] is None and out["mj_per_frame"] is None
    assert out["frames"] == 6
    assert "no INA3221" in out["description"]
    assert out["per_rail"] == {}


def test_a_failing_meter_is_counted_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    boards.orin_nano_jp6(root)
    monkeypatch.setenv("EDGERT_SYSROOT", str(root))
    from edgert.power.jetson_ina import JetsonInaMeter

    meter = JetsonInaMeter()
    s = PowerSampler(meter, hz=50).start()
    time.sleep(0.1)
    (meter.channels[0].volts_file or Path("/x")).unlink()
    time.sleep(0.1)
    s.stop()
    out = s.summary()
    assert out["errors"] >= 1
    assert "VDD_IN" in out["last_error"]
    assert out["avg_w"] == pytest.approx(4.968)
