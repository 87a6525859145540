"""The one queue of passes: a key queued once however often it is asked for, one pass of a key at a time,
the sooner of two due times, urgent keys first when the places are taken, the places bounded, a pass's
answer its key's next due time, and another driver (the deletion handler) holding a key's passes off."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from greyrelease.runtime.scheduler import Scheduler

T = TypeVar("T")


class Passes:
    """A ``run`` for the scheduler that records each pass (key, urgent), and blocks the keys in ``gates``
    until their gate is set; each pass answers ``after[key]`` (None when absent)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, bool]] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.after: dict[str, float | None] = {}
        self.running = 0
        self.most = 0

    async def __call__(self, key: str, urgent: bool) -> float | None:
        self.log.append((key, urgent))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            gate = self.gates.get(key)
            if gate is not None:
                await gate.wait()
            return self.after.get(key)
        finally:
            self.running -= 1

    def keys(self) -> list[str]:
        return [key for key, _ in self.log]


def run(test: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(test(), 10))


async def settle() -> None:
    """Let every task that can run, run (the passes here await nothing but their gates)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_key_asked_for_many_times_before_its_pass_is_one_pass() -> None:
    async def test() -> list[str]:
        passes = Passes()
        s = Scheduler(passes, in_flight=1)
        passes.gates["a"] = gate = asyncio.Event()
        s.add("a")  # takes the one place
        for _ in range(5):
            s.add("b")
            s.add("b", 0.01)
        gate.set()
        await asyncio.sleep(0.05)
        return passes.keys()

    assert run(test) == ["a", "b"]


def test_a_key_asked_for_while_its_pass_runs_runs_once_more_after_it_never_beside_it() -> None:
    async def test() -> tuple[list[str], int]:
        passes = Passes()
        s = Scheduler(passes)
        passes.gates["a"] = gate = asyncio.Event()
        s.add("a")
        await settle()
        for _ in range(3):
            s.add("a")
        await settle()
        assert passes.keys() == ["a"]  # not beside the first
        del passes.gates["a"]
        gate.set()
        await settle()
        return passes.keys(), passes.most

    assert run(test) == (["a", "a"], 1)


def test_the_sooner_of_two_due_times_wins_whichever_came_first() -> None:
    async def test() -> tuple[float | None, float | None]:
        s = Scheduler(Passes())
        s.add("late-then-soon", 60)
        s.add("late-then-soon", 5)
        s.add("soon-then-late", 5)
        s.add("soon-then-late", 60)
        return s.due("late-then-soon"), s.due("soon-then-late")

    late_then_soon, soon_then_late = run(test)
    assert late_then_soon is not None and 4 < late_then_soon <= 5
    assert soon_then_late is not None and 4 < soon_then_late <= 5


def test_a_delayed_key_runs_when_due_and_not_before() -> None:
    async def test() -> tuple[list[str], list[str]]:
        passes = Passes()
        s = Scheduler(passes)
        s.add("a", 0.2)
        s.add("b", 0.05)
        await asyncio.sleep(0.1)
        early = passes.keys()
        await asyncio.sleep(0.25)
        return early, passes.keys()

    assert run(test) == (["b"], ["b", "a"])


def test_a_pass_s_answer_is_when_its_key_is_due_again() -> None:
    async def test() -> tuple[float | None, float | None, int]:
        passes = Passes()
        passes.after = {"timer": 30.0, "done": None}
        s = Scheduler(passes)
        s.add("timer")
        s.add("done")
        await settle()
        return s.due("timer"), s.due("done"), len(s)

    timer, done, queued = run(test)
    assert timer is not None and 29 < timer <= 30
    assert done is None and queued == 1


def test_urgent_keys_go_ahead_of_routine_ones_when_the_places_are_taken() -> None:
    async def test() -> list[tuple[str, bool]]:
        passes = Passes()
        s = Scheduler(passes, in_flight=1)
        passes.gates["first"] = gate = asyncio.Event()
        s.add("first")
        await settle()
        s.add("routine-1")
        s.add("routine-2")
        s.add("urgent", urgent=True)
        s.add("routine-2", urgent=True)  # asked for again by a person: moves up
        gate.set()
        await settle()
        return passes.log

    assert run(test) == [("first", False), ("urgent", True), ("routine-2", True), ("routine-1", False)]


def test_no_more_passes_run_at_once_than_the_places() -> None:
    async def test() -> tuple[int, int]:
        passes = Passes()
        s = Scheduler(passes, in_flight=3)
        gate = asyncio.Event()
        for i in range(10):
            passes.gates[f"k{i}"] = gate
            s.add(f"k{i}")
        await settle()
        during = passes.running
        gate.set()
        await settle()
        return during, len(passes.log)

    assert run(test) == (3, 10)


def test_a_forgotten_key_does_not_run() -> None:
    async def test() -> tuple[list[str], int]:
        passes = Passes()
        s = Scheduler(passes)
        s.add("gone", 0.05)
        s.add("kept", 0.05)
        s.forget("gone")
        await asyncio.sleep(0.15)
        return passes.keys(), len(s)

    assert run(test) == (["kept"], 0)


def test_a_timer_that_comes_due_while_its_key_runs_runs_it_again_after() -> None:
    async def test() -> list[str]:
        passes = Passes()
        s = Scheduler(passes)
        passes.gates["a"] = gate = asyncio.Event()
        s.add("a")
        await settle()
        s.add("a", 0.02)
        await asyncio.sleep(0.05)
        del passes.gates["a"]
        gate.set()
        await settle()
        return passes.keys()

    assert run(test) == ["a", "a"]


def test_another_driver_waits_for_the_running_pass_and_holds_the_key_s_passes_off_until_it_lets_go() -> None:
    async def test() -> list[str]:
        passes = Passes()
        s = Scheduler(passes)
        order: list[str] = []
        passes.gates["a"] = gate = asyncio.Event()
        s.add("a")
        await settle()

        async def driver() -> None:
            release = await s.exclusive("a")
            order.append("driver")
            s.add("a", urgent=True)  # asked for meanwhile (the deletion mark's event)
            await settle()
            order.append(f"passes while held: {len(passes.log)}")
            release()

        holder = asyncio.create_task(driver())
        await settle()
        order.append("pass still running")
        del passes.gates["a"]
        gate.set()
        await holder
        await settle()
        order.append(f"passes: {len(passes.log)}")
        return order

    assert run(test) == ["pass still running", "driver", "passes while held: 1", "passes: 2"]


def test_a_stop_waits_for_the_running_passes_and_starts_no_more() -> None:
    async def test() -> tuple[list[str], int]:
        passes = Passes()
        s = Scheduler(passes, in_flight=1)
        passes.gates["a"] = gate = asyncio.Event()
        s.add("a")
        s.add("b")
        s.add("c", 0.01)
        await settle()
        stopping = asyncio.create_task(s.stop(timeout=5))
        await settle()
        assert not stopping.done()  # waits for a's pass
        gate.set()
        await stopping
        s.add("d")
        await asyncio.sleep(0.05)
        return passes.keys(), s.running

    assert run(test) == (["a"], 0)


def test_a_pass_that_raises_is_tried_again_later_not_lost() -> None:
    async def test() -> float | None:
        async def broken(key: str, urgent: bool) -> float | None:
            raise RuntimeError("a bug")

        s = Scheduler(broken)
        s.add("a")
        await settle()
        return s.due("a")

    due = run(test)
    assert due is not None and 9 < due <= 10


def test_many_releases_at_rest_are_keys_in_the_queue_not_tasks() -> None:
    async def test() -> tuple[int, int, int]:
        passes = Passes()
        passes.after = {f"r{i}": 600.0 + i for i in range(1000)}
        s = Scheduler(passes)
        for i in range(1000):
            s.add(f"r{i}")
        await settle()
        await asyncio.sleep(0.01)
        passes_running = [t for t in asyncio.all_tasks() if "Scheduler" in getattr(t.get_coro(), "__qualname__", "")]
        return len(passes.log), len(s), len(passes_running)

    assert run(test) == (1000, 1000, 0)


@pytest.mark.parametrize("in_flight", [0, -1])
def test_the_places_must_be_at_least_one(in_flight: int) -> None:
    with pytest.raises(ValueError, match="in_flight"):
        Scheduler(Passes(), in_flight=in_flight)


def test_a_release_runs_to_its_end_on_the_runtime_s_queue() -> None:
    """The runtime on the in-memory API server, its passes queued by the watch events a cluster would send
    (the release's own, its Deployments'), the control plane rolling out between them: the release ends
    Succeeded, and then nothing is due but its resync."""
    from greyrelease.runtime.controller import Runtime, Tuning

    from tests.support.builders import NS, RELEASE, cluster, roll_out, status_of

    kube = cluster(batches=[{"replicas": 1, "pause": "0s"}, {"replicas": 2, "pause": "0s"}, {"replicas": 4}])

    async def test() -> tuple[str, float | None, int]:
        rt = Runtime(kube, tuning=Tuning(threads=2, deployment_settle=0.01))
        try:
            rt.release_changed(kube.get(RELEASE) or {}, None)
            while status_of(kube).get("phase") != "Succeeded":
                await asyncio.sleep(0.02)
                roll_out(kube)
                rt.release_changed(kube.get(RELEASE) or {}, "MODIFIED")
                for name in ("web", "web-canary"):
                    rt.deployment_changed(NS, name, "MODIFIED")
            await asyncio.sleep(0.05)
            return status_of(kube)["phase"], rt.scheduler.due((NS, "web")), rt.scheduler.running
        finally:
            await rt.drain()
            rt.stop()

    phase, due, running = run(test)
    assert phase == "Succeeded" and running == 0
    assert due is not None and due > 600


def test_urgent_keys_have_places_of_their_own_which_routine_passes_cannot_take() -> None:
    async def test() -> tuple[list[tuple[str, bool]], int]:
        passes = Passes()
        s = Scheduler(passes, in_flight=1)
        gate = asyncio.Event()
        for key in ("routine", "routine-2", "urgent", "urgent-2"):
            passes.gates[key] = gate
        s.add("routine")  # takes the one routine place, and holds it (routine passes may be held back)
        s.add("routine-2")
        s.add("urgent", urgent=True)
        s.add("urgent-2", urgent=True)
        await settle()
        during = list(passes.log)
        gate.set()
        await settle()
        return during, len(passes.log)

    during, ran = run(test)
    assert during == [("routine", False), ("urgent", True)]  # one place of each kind
    assert ran == 4


def test_a_key_asked_for_urgently_while_its_routine_pass_runs_is_promoted_once() -> None:
    async def test() -> tuple[list[str], list[tuple[str, bool]]]:
        passes = Passes()
        promoted: list[str] = []
        s = Scheduler(passes, promote=promoted.append)
        passes.gates["a"] = gate = asyncio.Event()
        s.add("a")
        await settle()
        s.add("a")  # routine: nothing to move ahead
        assert promoted == []
        s.add("a", urgent=True)
        s.add("a", urgent=True)
        s.add("a", 5.0, urgent=True)  # a timer: not now
        gate.set()
        await settle()
        return promoted, passes.log

    promoted, log = run(test)
    assert promoted == ["a"]
    assert log == [("a", False), ("a", True)]  # and it still runs once more, urgently, after that pass
