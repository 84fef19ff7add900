"""The GPU pipeline's scheduler (one thread per slot, results in frame order), on plain Python work."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator

import pytest

from edgert.pipeline.gpu import ordered_parallel


class _Worker:
    def __init__(self, name: str, delay: float) -> None:
        self.name = name
        self.delay = delay
        self.seen: list[int] = []
        self.entered = 0
        self.thread: str | None = None


def _square(w: _Worker, item: int) -> tuple[str, int]:
    time.sleep(random.random() * w.delay)  # results finish out of order
    w.seen.append(item)
    return w.name, item * item


def test_results_come_back_in_order_from_every_worker() -> None:
    workers = [_Worker("a", 0.002), _Worker("b", 0.004), _Worker("c", 0.001)]
    out = list(ordered_parallel(range(200), workers, _square))
    assert [i for i, _ in out] == list(range(200))
    assert [r[1] for _, r in out] == [i * i for i in range(200)]
    assert sum(len(w.seen) for w in workers) == 200
    assert all(w.seen for w in workers)  # every slot took frames


def test_enter_and_prepare_run_once_per_worker_on_its_thread() -> None:
    workers = [_Worker("a", 0.0), _Worker("b", 0.0)]

    @contextlib.contextmanager
    def enter(w: _Worker) -> Iterator[None]:
        w.entered += 1
        yield

    def prepare(w: _Worker) -> None:
        w.thread = threading.current_thread().name

    assert len(list(ordered_parallel(range(10), workers, _square, enter=enter, prepare=prepare))) == 10
    assert [w.entered for w in workers] == [1, 1]
    assert {w.thread for w in workers} == {"edgert-gpu-slot0", "edgert-gpu-slot1"}


def test_a_worker_error_reaches_the_consumer_and_stops_the_others() -> None:
    taken: list[int] = []

    def items() -> Iterator[int]:
        for i in range(10_000):
            taken.append(i)
            yield i

    def fail_on_7(w: _Worker, item: int) -> int:
        if item == 7:
            raise ValueError("bad frame 7")
        time.sleep(0.001)
        return item

    with pytest.raises(ValueError, match="bad frame 7"):
        for _ in ordered_parallel(items(), [_Worker("a", 0), _Worker("b", 0)], fail_on_7):
            pass
    assert len(taken) < 100  # the threads stopped taking frames


def test_consumer_leaving_early_stops_the_workers() -> None:
    workers = [_Worker("a", 0.001), _Worker("b", 0.001)]
    gen = ordered_parallel(range(100_000), workers, _square)
    for i, _ in gen:
        if i == 5:
            break
    gen.close()  # joins the threads
    assert sum(len(w.seen) for w in workers) < 100
    assert not any(t.name.startswith("edgert-gpu-slot") for t in threading.enumerate())


def test_empty_input_and_a_failing_prepare() -> None:
    assert list(ordered_parallel([], [_Worker("a", 0)], _square)) == []

    def prepare(w: _Worker) -> None:
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        list(ordered_parallel(range(5), [_Worker("a", 0)], _square, prepare=prepare))
