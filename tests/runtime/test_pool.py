"""The pass threads: urgent passes first, results and errors handed back, a clean stop."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any

import pytest
from greyrelease.runtime.pool import PassPool


def test_an_urgent_pass_overtakes_the_queue_and_each_kind_keeps_its_order() -> None:
    pool = PassPool(1)
    gate = threading.Event()
    ran: list[str] = []
    busy = threading.Event()

    def block() -> bool:
        busy.set()
        return gate.wait(5)

    blocker = pool.submit(block)
    assert busy.wait(5)  # the one thread is busy: everything below queues
    futures: list[Future[Any]] = [pool.submit(ran.append, "timer-1"), pool.submit(ran.append, "timer-2")]
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


class _Held:
    """Something a pass hands back, or the failure it raises: told apart from what the test holds by a weakref."""


class _Failure(Exception):
    def __init__(self, held: _Held) -> None:
        super().__init__("failed")
        self.held = held


def test_an_idle_thread_keeps_neither_the_result_of_its_last_pass_nor_its_failure() -> None:
    """A pass's outcome (the plan, its status models) is dropped once its caller has it: not kept by the thread
    that ran it until its next pass, and a failure is freed by reference counting, with no cycle through
    the frames of its traceback for a garbage collection to find."""
    pool = PassPool(1)
    made: list[weakref.ref[_Held]] = []

    def succeed() -> _Held:
        held = _Held()
        made.append(weakref.ref(held))
        return held

    def fail() -> None:
        held = _Held()
        made.append(weakref.ref(held))
        raise _Failure(held)

    assert isinstance(pool.submit(succeed).result(timeout=5), _Held)
    with pytest.raises(_Failure):
        pool.submit(fail).result(timeout=5)
    gc.disable()  # freed by reference counting alone
    try:
        deadline = time.monotonic() + 5
        while any(r() is not None for r in made) and time.monotonic() < deadline:
            time.sleep(0.01)  # (the thread drops its last pass just after it handed over the failure)
        assert [r() for r in made] == [None, None]
    finally:
        gc.enable()
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


def _blocked(pool: PassPool, **kind: bool) -> tuple[threading.Event, list[float]]:
    """Submit a pass that runs until the returned gate opens; the list gets the time it ended."""
    gate, started = threading.Event(), threading.Event()
    ended: list[float] = []

    def run() -> None:
        started.set()
        gate.wait(10)
        ended.append(time.monotonic())

    pool.submit(run, **kind)
    assert started.wait(5)
    return gate, ended


def test_routine_passes_wait_while_an_abort_runs_and_for_the_quiet_time_after_it() -> None:
    pool = PassPool(4, hold=0.2, hold_max=30)
    gate, abort_ended = _blocked(pool, holds_routine=True)
    routine = pool.submit(time.monotonic)
    time.sleep(0.3)
    assert not routine.done()  # three threads are free, yet the routine pass waits for the abort
    assert pool.submit(time.monotonic, urgent=True).result(timeout=5)  # urgent ones do not wait
    gate.set()
    started = routine.result(timeout=5)
    assert started - abort_ended[0] >= 0.2
    pool.stop()


def test_a_routine_pass_is_held_back_no_longer_than_hold_max() -> None:
    pool = PassPool(2, hold=0.2, hold_max=0.3)
    gate, abort_ended = _blocked(pool, holds_routine=True)
    asked = time.monotonic()
    started = pool.submit(time.monotonic).result(timeout=5)
    assert started - asked >= 0.3 and not abort_ended  # it ran while the abort was still running
    gate.set()
    pool.stop()


def test_only_aborts_hold_routine_passes_back() -> None:
    pool = PassPool(2, hold=30, hold_max=30)
    gate, _ = _blocked(pool, urgent=True)
    assert pool.submit(time.monotonic).result(timeout=5)
    gate.set()
    pool.stop()


def test_stop_holds_nothing_back() -> None:
    pool = PassPool(2, hold=30, hold_max=30)
    gate, _ = _blocked(pool, holds_routine=True)
    routine = pool.submit(time.monotonic)
    pool.stop(wait=False)
    assert routine.result(timeout=5)
    gate.set()


def test_each_pass_reports_how_long_it_waited_and_its_kind() -> None:
    waits: list[tuple[bool, float]] = []
    pool = PassPool(1, waited=lambda urgent, seconds: waits.append((urgent, seconds)))
    gate, _ = _blocked(pool)
    pool.submit(int)
    pool.submit(int, holds_routine=True)
    time.sleep(0.1)
    gate.set()
    pool.stop()
    assert [u for u, _ in waits] == [False, True, False]  # the blocker, then the abort before the routine one
    assert waits[1][1] >= 0.1 and waits[2][1] >= 0.1
    with pytest.raises(ValueError):
        PassPool(1, hold=-1)


def test_held_passes_wake_one_idle_thread_not_all(monkeypatch: pytest.MonkeyPatch) -> None:
    wakeups = []

    class Counting(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            woken = super().wait(timeout)
            wakeups.append(self)
            return woken

    monkeypatch.setattr(threading, "Condition", Counting)
    pool = PassPool(64, hold=0.1, hold_max=0.3)
    time.sleep(0.2)  # every thread is idle, waiting
    gate, _ = _blocked(pool, holds_routine=True)
    held = []
    for _ in range(20):
        held.append(pool.submit(time.monotonic))
        time.sleep(0.01)
    assert all(f.result(timeout=5) for f in held)  # each let go by hold_max, while the abort runs
    gate.set()
    pool.stop()
    # Each submission and each pass taken wake one thread, and one thread waits for the time the next held
    # pass may start: a few wake-ups per pass, then 64 for the stop; not one per waiting thread per pass.
    woken = sum(1 for cond in wakeups if cond is pool._cond)
    assert woken < 64 + 5 * len(held), woken  # (it was about 660 while every idle thread waited for that time)


def test_a_failing_wait_report_costs_neither_the_pass_nor_the_thread() -> None:
    def failing_report(urgent: bool, seconds: float) -> None:
        raise ZeroDivisionError

    pool = PassPool(1, waited=failing_report)
    assert pool.submit(lambda: 7).result(timeout=5) == 7
    assert pool.submit(lambda: 8).result(timeout=5) == 8
    pool.stop()


def test_a_queued_routine_pass_promoted_goes_ahead_of_the_routine_ones_once() -> None:
    pool = PassPool(1)
    gate, _ = _blocked(pool)  # the one thread is busy: everything below queues
    ran: list[str] = []
    first, second, third = (pool.submit(ran.append, name) for name in ("routine-1", "routine-2", "asked-for"))
    assert pool.promote(third)
    assert not pool.promote(third)  # urgent already
    gate.set()
    for f in (first, second, third):
        f.result(timeout=5)
    assert ran == ["asked-for", "routine-1", "routine-2"]
    assert not pool.promote(third)  # done
    pool.stop()


def test_a_pass_promoted_for_an_abort_holds_the_routine_ones_back() -> None:
    pool = PassPool(1, hold=0.2, hold_max=30)
    gate, _ = _blocked(pool)
    ended: list[float] = []
    routine = pool.submit(time.monotonic)
    aborting = pool.submit(lambda: ended.append(time.monotonic()))
    assert pool.promote(aborting, holds_routine=True)
    gate.set()
    started = routine.result(timeout=5)
    aborting.result(timeout=5)
    assert started - ended[0] >= 0.2  # ran after it, and after the quiet time
    pool.stop()
