"""When a release's daemon is woken: Deployment changes gathered, deletions at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.runtime.controller import Registry, Runtime, Tuning

from tests.support.faults import refuse

RELEASE = ("shop", "web")


def wakes(registry: Registry, events: list[tuple[str, float]], settle: float = 0.05) -> int:
    """Feeds Deployment events ("MODIFIED"/"DELETED", seconds after the previous one) through the
    runtime's handler; the number of times the release was woken, over settle * 4 after the last."""

    async def run() -> int:
        rt = Runtime(MemoryKube(), tuning=Tuning(deployment_settle=settle))
        rt.registry = registry
        woken = 0
        wake = registry.event_for(RELEASE)

        async def count() -> None:
            nonlocal woken
            while True:
                await wake.wait()
                wake.clear()
                woken += 1

        counter = asyncio.create_task(count())
        try:
            for kind, after in events:
                await asyncio.sleep(after)
                rt.deployment_changed("shop", "web", kind)
            await asyncio.sleep(settle * 4)
        finally:
            counter.cancel()
        return woken

    return asyncio.run(run())


def registry(waiting: bool) -> Registry:
    r = Registry()
    r.watch(RELEASE, ("web", "web-canary"), waiting=waiting)
    return r


def test_a_burst_of_status_changes_is_one_wakeup() -> None:
    assert wakes(registry(waiting=True), [("MODIFIED", 0.0)] * 6) == 1


def test_changes_further_apart_than_the_settle_time_each_wake() -> None:
    assert wakes(registry(waiting=True), [("MODIFIED", 0.0), ("MODIFIED", 0.15), ("MODIFIED", 0.15)]) == 3


def test_a_release_on_hold_is_not_woken_by_status_changes_but_is_by_a_deletion() -> None:
    assert wakes(registry(waiting=False), [("MODIFIED", 0.0)] * 3) == 0
    assert wakes(registry(waiting=False), [("DELETED", 0.0)]) == 1


def test_an_unrelated_deployment_wakes_nothing() -> None:
    r = Registry()
    r.watch(RELEASE, ("api", "api-canary"), waiting=True)
    assert wakes(r, [("MODIFIED", 0.0), ("DELETED", 0.0)]) == 0


def test_forgetting_a_release_cancels_its_pending_wakeup() -> None:
    r = registry(waiting=True)

    async def run() -> bool:
        r.event_for(RELEASE)
        r.poke_soon(RELEASE, 0.05)
        wake = r.wake[RELEASE]
        r.forget(RELEASE)
        await asyncio.sleep(0.1)
        return wake.is_set()

    assert asyncio.run(run()) is False
    assert r.pending == {}


def test_a_person_s_change_makes_the_next_pass_urgent_and_our_status_writes_do_not() -> None:
    abort = {"greyrelease.io/abort": "true"}
    bodies = (
        obj(1, {}),  # first sight (a new release)
        obj(2, {}, {"phase": "Progressing"}),  # a status write of our own
        obj(3, abort, {"phase": "Progressing"}),  # an abort: its pass cuts traffic
        obj(4, abort, {"phase": "Aborted"}),  # our status write after it
        obj(5, abort, {"phase": "Aborted"}, generation=2),  # a new version: urgent, nothing to cut
        obj(6, abort),  # (a release aborted before it started has no traffic to cut either)
    )
    assert seen(bodies) == [
        (True, False),
        (False, False),
        (True, True),
        (False, False),
        (True, False),
        (True, False),
    ]


def obj(rv: int, annotations: dict[str, str], status: Obj | None = None, generation: int = 1) -> Obj:
    meta = {
        "name": "web",
        "namespace": "shop",
        "uid": "u1",
        "generation": generation,
        "resourceVersion": str(rv),
        "annotations": annotations,
    }
    return {"metadata": meta, "spec": {}, "status": status or {}}


def seen(bodies: tuple[Obj, ...]) -> list[tuple[bool, bool]]:
    """Feeds the release's watch events through the runtime's handler; after each, whether its next
    pass is urgent and whether it cuts traffic for an abort (which holds routine passes back)."""

    async def run() -> list[tuple[bool, bool]]:
        rt = Runtime(MemoryKube())
        r = rt.registry
        out = []
        for body in bodies:
            r.urgent.clear()
            r.aborting.clear()
            rt.release_changed(body, "MODIFIED")
            out.append((RELEASE in r.urgent, RELEASE in r.aborting))
            assert rt.releases.get("shop", "web") == body  # kept for the passes before anything is woken
        return out

    return asyncio.run(run())


# --- a release's daemon loop: passes, retries, sleeps ---------------------------------------------


def waits_between_passes(error: Callable[[], Exception], times: int) -> list[float]:
    """The waits of a release's daemon whose first ``times`` passes fail with ``error`` (then the pass finds no
    GreyRelease and the daemon ends)."""
    kube = MemoryKube()
    refuse(kube, error, times=times)
    slept: list[float] = []

    async def sleep(wake: asyncio.Event, seconds: float) -> None:
        slept.append(seconds)

    async def run() -> None:
        rt = Runtime(kube, tuning=Tuning(threads=2))
        try:
            await asyncio.wait_for(rt.run_release("shop", "web", lambda: False, sleep), 5)
        finally:
            rt.stop()

    asyncio.run(run())
    return slept


def test_a_failing_pass_is_retried_with_the_one_backoff_and_the_daemon_ends_when_the_release_is_gone() -> None:
    from greyrelease.kube.protocol import ApiError

    # then the pass found no GreyRelease: the daemon ended
    assert waits_between_passes(lambda: ApiError(500, "InternalError", "etcd"), times=3) == [1, 2, 4]


def test_a_daemon_asked_to_stop_while_its_passes_fail_ends() -> None:
    from greyrelease.kube.protocol import ApiError

    kube = MemoryKube()
    refuse(kube, lambda: ApiError(503, "ServiceUnavailable", "down"))
    slept: list[float] = []

    async def sleep(wake: asyncio.Event, seconds: float) -> None:
        slept.append(seconds)

    async def run() -> None:
        rt = Runtime(kube, tuning=Tuning(threads=2))
        try:
            await asyncio.wait_for(rt.run_release("shop", "web", lambda: len(slept) >= 5, sleep), 5)
        finally:
            rt.stop()

    asyncio.run(run())
    assert slept == [1, 2, 4, 8, 10]  # capped at 10 s


def test_the_backoff_starts_again_at_one_second_after_a_pass_that_succeeded() -> None:
    """One retrying object serves the daemon's life: a pass that succeeds ends its backoff, and the next
    failure waits 1 s again, not where the last run of failures stopped."""
    from greyrelease.api.release import GreyReleaseStatus, Phase
    from greyrelease.kube.protocol import ApiError
    from greyrelease.planner.actions import Plan
    from greyrelease.reconcile.reconciler import Outcome

    script = ["fail", "fail", "ok", "fail", "fail", "fail", "ok"]
    slept: list[float] = []

    async def sleep(wake: asyncio.Event, seconds: float) -> None:
        slept.append(seconds)

    class Scripted(Runtime):
        async def reconcile(
            self, namespace: str, name: str, *, urgent: bool = False, abort: bool = False
        ) -> Outcome | None:
            if not script:
                return None  # the release is gone: the daemon ends
            if script.pop(0) == "fail":
                raise ApiError(500, "InternalError", "etcd")
            return Outcome(Plan(GreyReleaseStatus(phase=Phase.PROGRESSING), requeue_after=30.0))

    async def run() -> None:
        rt = Scripted(MemoryKube(), tuning=Tuning(threads=2))
        try:
            await asyncio.wait_for(rt.run_release("shop", "web", lambda: False, sleep), 5)
        finally:
            rt.stop()

    asyncio.run(run())
    assert [round(s) for s in slept] == [1, 2, 30, 1, 2, 4, 30]


def test_the_body_kopf_keeps_for_a_release_is_the_stored_one_without_managed_fields() -> None:
    from greyrelease.runtime import operator

    body = obj(1, {})
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]

    # kopf's decorator types the handler as kopf calls it, with every keyword kopf passes; the test passes
    # only those it reads (the rest are taken by its ``**_``).
    release_changed = cast(Callable[..., Awaitable[None]], operator.release_changed)

    async def run() -> Runtime:
        rt = Runtime(MemoryKube())
        await release_changed(event={"type": "MODIFIED", "object": body}, type="MODIFIED", memo={"runtime": rt})
        return rt

    rt = asyncio.run(run())
    assert "managedFields" not in body["metadata"]  # dropped in place, from the dict kopf holds
    assert rt.releases._objects["shop", "web"][1] is body  # and the store holds that dict, not a second copy


def test_a_pass_that_met_a_conflict_is_planned_again_at_once_then_on_the_backoff() -> None:
    """A 409 is cured by reading again, not by waiting: the first retry after one goes at once, the next
    ones wait as if that conflict had not been."""
    from greyrelease.kube.protocol import Conflict

    waits = waits_between_passes(lambda: Conflict(409, "Conflict", "the object has been modified"), times=4)
    assert waits == [0, 1, 2, 4]
