"""The pass threads: urgent passes first, results and errors handed back, a clean stop."""

from __future__ import annotations

import threading

import pytest

from greyrelease.pool import PassPool


def test_an_urgent_pass_overtakes_the_queue_and_each_kind_keeps_its_order() -> None:
    pool = PassPool(1)
    gate = threading.Event()
    ran: list[str] = []
    busy = threading.Event()
    blocker = pool.submit(lambda: busy.set() or gate.wait(5))
    assert busy.wait(5)  # the one thread is busy: everything below queues
    futures = [pool.submit(ran.append, "timer-1"), pool.submit(ran.append, "timer-2")]
    futures += [pool.submit(ran.append, "abort-1", urgent=True), pool.submit(ran.append, "abort-2", urgent=True)]
    assert pool.queued() == 4
    gate.set()
    for f in [blocker, *futures]:
        f.result(timeout=5)
    assert ran == ["abort-1", "abort-2", "timer-1", "timer-2"]
    pool.stop()


def test_results_and_errors_come_back_through_the_future() -> None:
    pool = PassPool(2)
    assert pool.submit(sum, [1, 2, 3]).result(timeout=5) == 6
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    pool.stop()


def test_a_pass_cancelled_while_queued_never_runs() -> None:
    pool = PassPool(1)
    gate = threading.Event()
    ran: list[int] = []
    pool.submit(gate.wait, 5)
    queued = pool.submit(ran.append, 1)
    assert queued.cancel()
    gate.set()
    pool.stop()
    assert ran == [] and queued.cancelled()


def test_stop_runs_what_is_queued_then_ends_the_threads_and_refuses_more() -> None:
    pool = PassPool(3)
    done = [pool.submit(lambda i=i: i * i) for i in range(20)]
    pool.stop()
    assert [f.result(timeout=0) for f in done] == [i * i for i in range(20)]
    assert not any(t.is_alive() for t in pool._threads)
    with pytest.raises(RuntimeError):
        pool.submit(print)


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError):
        PassPool(0)
