"""When a release's pass is queued: Deployment changes gathered, deletions at once, a person's change
urgently; and when it is due again after a pass (its plan's timer, the backoff after a failure)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import cast

import pytest
from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.reconcile.reconciler import Outcome
from greyrelease.runtime.controller import Registry, Runtime, Tuning, fingerprint

from tests.support.faults import refuse

RELEASE = ("shop", "web")


class Counting(Runtime):
    """A runtime whose passes are counted, not run."""

    passes = 0

    async def run_pass(self, key: tuple[str, str], urgent: bool) -> float | None:
        self.passes += 1
        return None


def wakes(registry: Registry, events: list[tuple[str, float]], settle: float = 0.05) -> int:
    """Feeds Deployment events ("MODIFIED"/"DELETED", seconds after the previous one) through the
    runtime's handler; the number of passes of the release, over settle * 4 after the last."""

    async def run() -> int:
        rt = Counting(MemoryKube(), tuning=Tuning(deployment_settle=settle))
        rt.registry = registry
        for kind, after in events:
            await asyncio.sleep(after)
            rt.deployment_changed("shop", "web", kind)
        await asyncio.sleep(settle * 4)
        return rt.passes

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


def test_a_relist_of_the_deployments_wakes_the_releases_about_one_in_that_namespace() -> None:
    """What changed while the watch could not resume came with no event: after the relist, every release
    about a Deployment there looks again, waiting on it or not (one may have been deleted)."""

    async def run() -> list[tuple[str, str]]:
        rt = Counting(MemoryKube(), tuning=Tuning(deployment_settle=0.01))
        rt.registry.watch(("shop", "web"), ("web", "web-canary"), waiting=True)
        rt.registry.watch(("shop", "api"), ("api",), waiting=False)
        rt.registry.watch(("other", "web"), ("web",), waiting=True)
        rt.deployments_relisted("shop")
        woken = sorted(
            k for k in (("shop", "web"), ("shop", "api"), ("other", "web")) if rt.scheduler.due(k) is not None
        )
        rt.deployments_relisted(None)  # a reflector of the whole cluster
        assert len(rt.scheduler) == 3
        rt.stop()
        return woken

    assert asyncio.run(run()) == [("shop", "api"), ("shop", "web")]


def test_a_release_deleted_loses_its_pending_pass() -> None:
    async def run() -> int:
        rt = Counting(MemoryKube(), tuning=Tuning(deployment_settle=0.05))
        rt.registry = registry(waiting=True)
        rt.deployment_changed("shop", "web", "MODIFIED")  # a pass due in 0.05 s
        rt.release_changed(obj(9, {}), "DELETED")
        await asyncio.sleep(0.1)
        return rt.passes

    assert asyncio.run(run()) == 0


def test_a_person_s_change_makes_the_next_pass_urgent_and_our_status_writes_do_not() -> None:
    abort = {"greyrelease.io/abort": "true"}
    bodies = (
        (obj(1, {}), "MODIFIED"),  # first sight (a new release)
        (obj(2, {}, {"phase": "Progressing"}), "MODIFIED"),  # a status write of our own
        (obj(3, abort, {"phase": "Progressing"}), "MODIFIED"),  # an abort: its pass cuts traffic
        (obj(4, abort, {"phase": "Aborted"}), "MODIFIED"),  # our status write after it
        (obj(5, abort, {"phase": "Aborted"}, generation=2), "MODIFIED"),  # a new version: nothing to cut
        (obj(6, abort), "MODIFIED"),  # (a release aborted before it started has no traffic to cut either)
    )
    assert seen(bodies) == [
        [(True, False)],
        [],
        [(True, True)],
        [],
        [(True, False)],
        [(True, False)],
    ]


def test_a_release_listed_at_the_controller_s_start_is_passed_but_not_urgently() -> None:
    """kopf's first list of the releases (event type None) queues every one, behind what people ask."""
    assert seen(((obj(1, {}), None), (obj(2, {}, generation=2), "MODIFIED"))) == [[(False, False)], [(True, False)]]


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


def seen(bodies: tuple[tuple[Obj, str | None], ...]) -> list[list[tuple[bool, bool]]]:
    """Feeds the release's watch events (body, type) through the runtime's handler; after each, the passes
    it led to: whether each was urgent and whether it cut traffic for an abort (which holds routine passes
    back)."""

    class Recording(Runtime):
        passes: list[tuple[bool, bool]]

        async def reconcile(
            self, namespace: str, name: str, *, urgent: bool = False, abort: bool = False
        ) -> Outcome | None:
            self.passes.append((urgent, abort))
            return None

    async def run() -> list[list[tuple[bool, bool]]]:
        rt = Recording(MemoryKube())
        out = []
        for body, kind in bodies:
            rt.passes = []
            rt.release_changed(body, kind)
            assert rt.releases.get("shop", "web") == body  # kept for the passes before any is queued
            await asyncio.sleep(0.01)
            out.append(rt.passes)
        return out

    return asyncio.run(run())


# --- after a pass: when the release is due again -------------------------------------------------


def waits_between_passes(error: Callable[[], Exception], times: int | None, passes: int = 10) -> list[float]:
    """The waits after each pass of a release whose first ``times`` passes (all, when None) fail with
    ``error``, as the scheduler is told them, until a pass finds no GreyRelease (not due again) or after
    ``passes`` passes."""
    kube = MemoryKube()
    refuse(kube, error, times=times)
    waits: list[float] = []

    async def run() -> None:
        rt = Runtime(kube, tuning=Tuning(threads=2))
        try:
            while len(waits) < passes and (after := await rt.run_pass(RELEASE, False)) is not None:
                waits.append(after)
        finally:
            rt.stop()

    asyncio.run(run())
    return waits


def test_a_failing_pass_is_retried_on_the_backoff_and_not_again_once_the_release_is_gone() -> None:
    from greyrelease.kube.protocol import ApiError

    # then the pass found no GreyRelease: not due again
    assert waits_between_passes(lambda: ApiError(500, "InternalError", "etcd"), times=3) == [1, 2, 4]


def test_a_release_whose_passes_keep_failing_is_tried_every_10_s_at_most() -> None:
    from greyrelease.kube.protocol import ApiError

    assert waits_between_passes(lambda: ApiError(503, "ServiceUnavailable", "down"), times=None, passes=6) == [
        1,
        2,
        4,
        8,
        10,
        10,
    ]


def test_the_backoff_starts_again_at_one_second_after_a_pass_that_succeeded() -> None:
    """A pass that succeeds ends its release's backoff: the next failure waits 1 s again, not where the last
    run of failures stopped."""
    from greyrelease.api.release import GreyReleaseStatus, Phase
    from greyrelease.kube.protocol import ApiError
    from greyrelease.planner.actions import Plan

    script = ["fail", "fail", "ok", "fail", "fail", "fail", "ok"]

    class Scripted(Runtime):
        async def reconcile(
            self, namespace: str, name: str, *, urgent: bool = False, abort: bool = False
        ) -> Outcome | None:
            if not script:
                return None  # the release is gone: not due again
            if script.pop(0) == "fail":
                raise ApiError(500, "InternalError", "etcd")
            return Outcome(Plan(GreyReleaseStatus(phase=Phase.PROGRESSING), requeue_after=30.0))

    async def run() -> list[float]:
        rt = Scripted(MemoryKube(), tuning=Tuning(threads=2))
        waits = []
        try:
            while (after := await rt.run_pass(RELEASE, False)) is not None:
                waits.append(after)
        finally:
            rt.stop()
        return waits

    assert [round(s) for s in asyncio.run(run())] == [1, 2, 30, 1, 2, 4, 30]


def test_a_release_with_nothing_scheduled_is_looked_at_again_within_the_resync_give_or_take_a_tenth() -> None:
    from greyrelease.api.release import GreyReleaseStatus, Phase
    from greyrelease.planner.actions import Plan

    class AtRest(Runtime):
        async def reconcile(
            self, namespace: str, name: str, *, urgent: bool = False, abort: bool = False
        ) -> Outcome | None:
            return Outcome(Plan(GreyReleaseStatus(phase=Phase.SUCCEEDED)))

    async def run() -> list[float]:
        rt = AtRest(MemoryKube(), tuning=Tuning(threads=2, idle_resync=900))
        try:
            return [await rt.run_pass((f"ns-{i}", "web"), False) or 0.0 for i in range(200)]
        finally:
            rt.stop()

    waits = asyncio.run(run())
    assert all(810 <= w <= 990 for w in waits), (min(waits), max(waits))
    assert max(waits) - min(waits) > 100  # spread, not all at once
    assert waits == asyncio.run(run())  # the same for a release each time


def test_a_release_marked_for_deletion_is_left_to_its_deletion_handler() -> None:
    async def run() -> tuple[float | None, int]:
        calls = 0

        class Watching(Runtime):
            async def reconcile(
                self, namespace: str, name: str, *, urgent: bool = False, abort: bool = False
            ) -> Outcome | None:
                nonlocal calls
                calls += 1
                return None

        rt = Watching(MemoryKube(), tuning=Tuning(threads=2))
        body = obj(1, {})
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        rt.registry.last_seen[RELEASE] = fingerprint(body)
        try:
            return await rt.run_pass(RELEASE, True), calls
        finally:
            rt.stop()

    assert asyncio.run(run()) == (None, 0)


def test_the_body_kopf_keeps_for_a_release_is_the_stored_one_without_managed_fields() -> None:
    from greyrelease.runtime import operator

    body = obj(1, {})
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]

    # kopf's decorator types the handler as kopf calls it, with every keyword kopf passes; the test passes
    # only those it reads (the rest are taken by its ``**_``).
    release_changed = cast(Callable[..., Awaitable[None]], operator.release_changed)

    async def run() -> object:
        rt = Runtime(MemoryKube())
        await release_changed(event={"type": "MODIFIED", "object": body}, type="MODIFIED", memo={"runtime": rt})
        # Looked at before the loop runs anything else: the pass the event queued would find no such release
        # in the empty API server and drop it from the store.
        return rt.releases._objects["shop", "web"][1]

    kept = asyncio.run(run())
    assert "managedFields" not in body["metadata"]  # dropped in place, from the dict kopf holds
    assert kept is body  # and the store holds that dict, not a second copy


def test_a_pass_that_met_a_conflict_is_planned_again_at_once_then_on_the_backoff() -> None:
    """A 409 is cured by reading again, not by waiting: the first retry after one goes at once, the next
    ones wait as if that conflict had not been."""
    from greyrelease.kube.protocol import Conflict

    waits = waits_between_passes(lambda: Conflict(409, "Conflict", "the object has been modified"), times=4)
    assert waits == [0, 1, 2, 4]


@pytest.mark.parametrize("seconds", ["0", "-5"])
def test_a_resync_period_that_is_not_positive_is_refused_naming_the_flag(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from greyrelease.cli.main import main

    assert main(["run", f"--resync-seconds={seconds}"]) == 2
    assert f"--resync-seconds {float(seconds):g}" in capsys.readouterr().err


def test_a_release_asked_for_while_its_routine_pass_waits_for_a_thread_has_that_pass_go_first() -> None:
    """An abort of a release whose routine pass is queued behind others (or held back by other aborts) is not
    left waiting for that pass: the pass is moved ahead, and reads the release as it then is."""
    ran: list[str] = []
    gate = threading.Event()

    async def run() -> None:
        rt = Runtime(MemoryKube(), tuning=Tuning(threads=1))
        loop, busy = asyncio.get_running_loop(), asyncio.Event()

        def reconcile(namespace: str, name: str, *, now: datetime | None = None) -> Outcome | None:
            if name == "busy":
                loop.call_soon_threadsafe(busy.set)
                gate.wait(5)
            ran.append(name)
            return None

        rt.reconciler.reconcile = reconcile  # type: ignore[method-assign]
        try:
            rt.scheduler.add(("shop", "busy"))
            await asyncio.wait_for(busy.wait(), 5)  # the one thread is busy: the passes below queue
            for name in ("first", "second", "asked-for"):
                rt.scheduler.add(("shop", name))
            await asyncio.sleep(0.05)
            rt.scheduler.add(("shop", "asked-for"), urgent=True)
            gate.set()
            for _ in range(500):
                if len(ran) == 5:
                    break
                await asyncio.sleep(0.01)
        finally:
            rt.stop()

    asyncio.run(run())
    assert ran[:2] == ["busy", "asked-for"]
    assert sorted(ran) == ["asked-for", "asked-for", "busy", "first", "second"]  # and once more, urgently


def test_a_release_not_yet_started_whose_pass_runs_when_a_slot_frees_is_passed_again() -> None:
    """Its pass may have read the queue before the change: it is known to wait only once that pass ends, so
    the wake-up of the releases held back would miss it. A release already under way is not passed again."""

    async def run() -> list[tuple[str, str]]:
        passes: list[tuple[str, str]] = []
        release = asyncio.Event()

        class Slow(Runtime):
            async def run_pass(self, key: tuple[str, str], urgent: bool) -> float | None:
                passes.append(key)
                if len(passes) <= 2:
                    await release.wait()  # the first passes run while the other release takes its slot
                return None

        rt = Slow(MemoryKube(), tuning=Tuning(threads=2))
        rt.registry.phase_seen[("shop", "under-way")] = "Progressing"
        rt.scheduler.add(("shop", "new"))
        rt.scheduler.add(("shop", "under-way"))
        await asyncio.sleep(0.05)
        rt.wake_held_back(ended=True)
        release.set()
        await asyncio.sleep(0.1)
        return passes

    assert asyncio.run(run()) == [("shop", "new"), ("shop", "under-way"), ("shop", "new")]
