"""The budget controller against a simulated board, with real threads.

The board draws idle + J x (frames per second) through a lag, with noise; a worker thread plays the
pipeline: ``admit()`` then one frame of work on the board, while the controller's sampler thread reads
the board. Time is a :class:`VirtualClock` (it jumps whenever every thread sleeps), so each 60 s run
takes a fraction of a second and does not depend on the machine's load; one run on a 20x scaled wall
clock checks the same on real time.
"""

from __future__ import annotations

import statistics
import threading

import pytest

from edgert.config import PowerConfig
from edgert.errors import ConfigError, PowerError
from edgert.power import BudgetController, NullMeter, ScaledClock, SimulatedBoard, budget_admission, parse_watts
from edgert.power.clock import Clock, VirtualClock
from edgert.power.sampler import Sample

SETTLE_S = 30.0
MEASURE_S = 30.0


def _pipeline(board: SimulatedBoard, admit: BudgetController, seconds: float) -> None:
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            admit()
            board.process_frame()

    clock = board.clock
    worker = threading.Thread(target=work, name="pipeline", daemon=True)
    clock.register()  # this thread, then the worker: time waits for both from the start
    clock.register(worker)
    worker.start()
    clock.sleep(seconds)
    stop.set()
    clock.sleep(1.0)  # the worker sees the stop within a frame and ends
    admit.close()
    if isinstance(clock, VirtualClock):
        clock.leave()
    worker.join(timeout=10)


def _window(ctl: BudgetController, t0: float, settle: float = SETTLE_S, measure: float = MEASURE_S) -> list[Sample]:
    return [s for s in ctl.sampler.samples() if settle <= s.reading.time - t0 <= settle + measure]


def _measured(ctl: BudgetController, t0: float, settle: float = SETTLE_S, measure: float = MEASURE_S) -> list[float]:
    return [s.reading.total_w for s in _window(ctl, t0, settle, measure)]


BOARDS = {
    # an Orin-Nano-sized board: 3 W idle, 15 W flat out
    "small": dict(idle_w=3.0, joules_per_frame=0.2, max_fps=60, lag_s=0.3, noise_w=0.05),
    # slower, noisier sensing
    "laggy": dict(idle_w=3.0, joules_per_frame=0.2, max_fps=60, lag_s=1.0, noise_w=0.5),
    # a data-centre GPU: 100 W idle, 700 W flat out
    "gpu": dict(idle_w=100.0, joules_per_frame=5.0, max_fps=120, lag_s=1.0, noise_w=5.0),
}


@pytest.mark.parametrize("board_name", list(BOARDS))
@pytest.mark.parametrize("fraction", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
def test_average_power_settles_within_5_percent_of_the_budget(fraction: float, board_name: str) -> None:
    clock = VirtualClock()
    board = SimulatedBoard(**BOARDS[board_name], clock=clock, seed=int(fraction * 100))  # type: ignore[arg-type]
    budget = fraction * board.unconstrained_w
    ctl = BudgetController(board, budget, sample_hz=10)
    t0 = clock.now()
    _pipeline(board, ctl, SETTLE_S + MEASURE_S)
    watts = _measured(ctl, t0)
    assert 300 <= len(watts) <= 301  # 30 s at 10 Hz
    avg = statistics.fmean(watts)
    assert abs(avg - budget) <= 0.05 * budget, (avg, budget, len(watts), ctl.stats())
    assert avg <= budget  # at or under, not around
    assert board.clock.stalls == 0  # type: ignore[attr-defined]  # time never moved on without a thread
    stats = ctl.stats()
    assert stats["budget_w"] == budget
    assert stats["over_budget_fraction"] is not None and stats["over_budget_fraction"] < 0.2
    # the highest rate the budget allows: (setpoint - idle) / J
    best_fps = (budget * (1 - ctl.margin) - board.idle_w) / board.joules_per_frame
    window = _window(ctl, t0)
    fps = (window[-1].frames - window[0].frames) / (window[-1].reading.time - window[0].reading.time)
    assert fps == pytest.approx(best_fps, rel=0.05)
    assert stats["frames"] > 0 and stats["mj_per_frame"] is not None


def test_the_same_on_a_real_time_clock() -> None:
    """Real threads on a 10x wall clock (3 s): looser, since sleeps overshoot on a loaded machine."""
    clock = ScaledClock(10.0)
    board = SimulatedBoard(idle_w=3.0, joules_per_frame=0.2, max_fps=60, lag_s=0.3, noise_w=0.05, clock=clock)
    budget = 0.6 * board.unconstrained_w
    ctl = BudgetController(board, budget, sample_hz=10)
    t0 = clock.now()
    _pipeline(board, ctl, 30.0)
    avg = statistics.fmean(_measured(ctl, t0, settle=15.0, measure=15.0))
    # Under budget always; how close depends on how late sleeps wake on a loaded machine.
    assert 0.6 * budget <= avg <= 1.03 * budget, (avg, budget)


def _virtual_board() -> SimulatedBoard:
    return SimulatedBoard(idle_w=3.0, joules_per_frame=0.2, max_fps=60, clock=VirtualClock())


def test_a_budget_above_the_unconstrained_draw_does_not_slow_the_pipeline() -> None:
    board = _virtual_board()
    ctl = BudgetController(board, 2 * board.unconstrained_w)
    t0 = board.clock.now()
    _pipeline(board, ctl, 20)
    stats = ctl.stats()
    window = _window(ctl, t0, settle=10, measure=10)
    fps = (window[-1].frames - window[0].frames) / (window[-1].reading.time - window[0].reading.time)
    assert fps == pytest.approx(60, rel=0.02)
    assert stats["over_budget_fraction"] == 0.0
    assert ctl.rate <= 2 * 60 + 1  # the integrator did not wind up


def test_a_budget_below_idle_draw_runs_at_the_minimum_rate_and_says_so() -> None:
    board = _virtual_board()
    ctl = BudgetController(board, 2.0)
    _pipeline(board, ctl, 15)
    stats = ctl.stats()
    assert stats["at_min_rate"] is True
    assert stats["over_budget_fraction"] > 0.9


def test_budget_admission_from_config() -> None:
    board = SimulatedBoard(clock=Clock())
    assert budget_admission(PowerConfig()) is None
    admit = budget_admission(PowerConfig(budget_w=9.0, rail="VDD_IN", sample_hz=20), meter=board)
    assert admit is not None
    admit()
    admit()
    admit.close()
    stats = admit.stats()
    assert stats["budget_w"] == 9.0 and stats["rail"] == "VDD_IN" and stats["frames"] == 2
    with pytest.raises(PowerError, match=r"rail 'VDD_GPU' not found.*VDD_IN"):
        budget_admission(PowerConfig(budget_w=9.0, rail="VDD_GPU"), meter=board)
    with pytest.raises(PowerError, match=r"needs a power meter.*no INA3221"):
        budget_admission(PowerConfig(budget_w=9.0), meter=NullMeter("no INA3221"))


def test_budget_admission_without_a_meter_here_says_why(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EDGERT_SYSROOT", str(tmp_path))
    with pytest.raises(PowerError, match="needs a power meter"):
        budget_admission(PowerConfig(budget_w=10.0))


@pytest.mark.parametrize(("text", "watts"), [("10W", 10.0), ("7.5", 7.5), ("500mW", 0.5), (" 12 w ", 12.0),
                                             ("0.3kW", 300.0), (15, 15.0)])
def test_parse_watts(text: str, watts: float) -> None:
    assert parse_watts(text) == watts


@pytest.mark.parametrize("text", ["", "ten watts", "10V", "-5W", "0W", "W"])
def test_parse_watts_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="watts"):
        parse_watts(text)


def test_budget_admission_closes_the_meter_it_opened(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from tests.power import boards

    boards.tegrastats_script(tmp_path, boards.ORIN_NANO_JP6_LINE)
    monkeypatch.setenv("EDGERT_SYSROOT", str(tmp_path))
    ctl = budget_admission(PowerConfig(budget_w=6.0, meter="tegrastats", sample_hz=20))
    assert ctl is not None and ctl.meter.kind == "tegrastats"
    ctl()
    ctl.close()
    assert ctl.meter._proc.poll() is not None  # type: ignore[attr-defined]  # the tegrastats process ended
    assert ctl.stats()["meter_errors"] == 0
