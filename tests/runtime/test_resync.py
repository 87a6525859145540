"""The resync of a release at rest, and the poll of one waiting for its stable to roll: no pass while nothing
its last pass read has changed in memory (the release, its Deployments, the hold's self-test result, the
policies), a pass as soon as one of them has, when its plan's deadline comes, and all the same once
``full_resync`` has gone by; a person's ask always passes it."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable

from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.reconcile.held import HeldSelfTest
from greyrelease.reconcile.reconciler import Outcome
from greyrelease.runtime.controller import Runtime, Tuning
from prometheus_client import REGISTRY

from tests.support.builders import NS
from tests.support.follow_cluster import RELEASE, WEB, cluster, roll_out

KEY = (NS, "web")
POLICIES = path("greyrelease.io", "v1", "greyreleasepolicies")
POLICY: Obj = {
    "apiVersion": "greyrelease.io/v1",
    "kind": "GreyReleasePolicy",
    "metadata": {"name": "shop-hours"},
    "spec": {"namespaces": [NS], "windows": [{"days": ["Mon"], "start": "09:00", "end": "17:00"}]},
}


class Counted(Runtime):
    """A runtime that counts the passes its resyncs made."""

    passes = 0

    async def reconcile(
        self, namespace: str, name: str, *, urgent: bool = False, abort: bool = False
    ) -> Outcome | None:
        self.passes += 1
        return await super().reconcile(namespace, name, urgent=urgent, abort=abort)


async def until(check: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(5):
        while not check():
            await asyncio.sleep(0.005)
    assert check(), what


def unchanged_count() -> float:
    return REGISTRY.get_sample_value("greyrelease_passes_skipped_total") or 0.0


async def at_rest(kube: MemoryKube, rt: Counted) -> None:
    """The release's store and the Deployments' in step with the server, and passes until one finds the
    release at rest (Idle, nothing to do, no timer)."""
    await rt.watch(kube, [NS])
    for _ in range(10):
        await fresh(kube, rt)
        await rt.run_pass(KEY, False)
        if KEY in rt.registry.resting:
            return
        roll_out(kube)
    raise AssertionError("the release never came to rest")


async def fresh(kube: MemoryKube, rt: Runtime) -> None:
    """The runtime's memory holds what the server holds: the release (as kopf's watch would hand it over) and
    the Deployment (its reflector, on a thread of its own)."""
    release, web = kube.get(RELEASE), kube.get(WEB)
    assert release is not None and web is not None
    rt.releases.fold(release)
    await until(lambda: rt.deployments.version(NS, "web") == web["metadata"]["resourceVersion"], "the Deployment seen")


def test_a_release_at_rest_is_not_passed_again_until_something_it_read_changes() -> None:
    kube = cluster()

    async def run() -> list[tuple[str, int, bool]]:
        rt = Counted(kube, tuning=Tuning(threads=2, idle_resync=900))
        steps: list[tuple[str, int, bool]] = []

        async def resync(step: str) -> None:
            before, unchanged = rt.passes, unchanged_count()
            wait = await rt.run_pass(KEY, False)
            assert wait is not None and 810 <= wait <= 990  # due again after the resync period either way
            steps.append((step, rt.passes - before, unchanged_count() > unchanged))

        try:
            await at_rest(kube, rt)
            await resync("at rest")
            await resync("at rest again")
            kube.patch(WEB, {"spec": {"replicas": 5}})  # an HPA's resize
            roll_out(kube)
            await fresh(kube, rt)
            await resync("the Deployment changed")
            await resync("at rest after it")
            kube.patch(RELEASE, {"metadata": {"labels": {"team": "shop"}}})  # a change no event woke it for
            await fresh(kube, rt)
            await resync("the release changed")
            kube.create(POLICIES, POLICY)
            await until(lambda: len(rt.policies) == 1, "the policy seen")
            await resync("a policy came")
            await resync("at rest with it")
            elsewhere = copy.deepcopy(POLICY)
            elsewhere["metadata"]["name"], elsewhere["spec"]["namespaces"] = "elsewhere", ["other"]
            kube.create(POLICIES, elsewhere)
            await until(lambda: len(rt.policies) == 2, "the other policy seen")
            await resync("a policy of another namespace came")
            await resync("at rest still")
            before = rt.passes
            await rt.run_pass(KEY, True)  # a person's ask
            steps.append(("urgent", rt.passes - before, False))
        finally:
            rt.stop()
        return steps

    assert asyncio.run(run()) == [
        ("at rest", 0, True),
        ("at rest again", 0, True),
        ("the Deployment changed", 1, False),
        ("at rest after it", 0, True),
        ("the release changed", 1, False),
        ("a policy came", 1, False),
        ("at rest with it", 0, True),
        ("a policy of another namespace came", 0, True),
        ("at rest still", 0, True),
        ("urgent", 1, False),
    ]


def test_a_changed_self_test_result_passes_a_release_at_rest() -> None:
    kube = cluster()
    tester = HeldSelfTest(kube, confirmations=0)

    async def run() -> tuple[int, int]:
        rt = Counted(kube, tuning=Tuning(threads=2), held=tester)
        try:
            await rt.start_held_selftest()
            await rt.scheduler.stop(0)  # the passes below are this test's, not the queue's
            await at_rest(kube, rt)
            before = rt.passes
            await rt.run_pass(KEY, False)
            quiet = rt.passes - before
            kube.admit = None  # the webhook goes: the self-test's result changes
            await asyncio.to_thread(tester.run)
            assert tester.result.status == "False"
            await rt.run_pass(KEY, False)
            return quiet, rt.passes - before
        finally:
            rt.stop()

    assert asyncio.run(run()) == (0, 1)


def test_a_release_at_rest_is_passed_in_full_once_the_full_resync_is_due() -> None:
    kube = cluster()

    async def run() -> tuple[int, int]:
        rt = Counted(kube, tuning=Tuning(threads=2, full_resync=0.3))
        try:
            await at_rest(kube, rt)
            before = rt.passes
            await rt.run_pass(KEY, False)
            quiet = rt.passes - before
            await asyncio.sleep(0.4)  # past the full resync (0.3 s, give or take 10 %)
            await rt.run_pass(KEY, False)
            return quiet, rt.passes - before
        finally:
            rt.stop()

    assert asyncio.run(run()) == (0, 1)


def test_without_the_deployments_in_memory_every_resync_is_a_pass() -> None:
    """Before the first list of Deployments (or without a watch), a pass reads the API server, whose
    changes no version held in memory shows."""
    kube = cluster()

    async def run() -> int:
        rt = Counted(kube, tuning=Tuning(threads=2))
        try:
            for _ in range(4):
                release = kube.get(RELEASE)
                assert release is not None
                rt.releases.fold(release)
                await rt.run_pass(KEY, False)
                roll_out(kube)
            return rt.passes
        finally:
            rt.stop()

    assert asyncio.run(run()) == 4


def test_a_promotion_s_polls_make_no_pass_until_its_stable_changes_or_its_deadline_comes() -> None:
    from tests.support import builders

    kube = builders.cluster(progressDeadlineSeconds=4)

    async def run() -> tuple[str, list[float], int, str]:
        rt = Counted(kube, tuning=Tuning(threads=2))
        try:
            await rt.watch(kube, [NS])
            phase = ""
            for _ in range(20):  # through the batches, the control plane converging between passes
                await fresh(kube, rt)
                await rt.run_pass(KEY, False)
                phase = builders.status_of(kube).get("phase", "")
                if phase == "Promoting":
                    break
                builders.roll_out(kube)
            # The stable's old pods settle (the last batch scaled it down), it is given the new image, and it
            # does not roll: the pass after that waits for it, polling, until the promotion's deadline.
            builders.roll_out(kube)
            for _ in range(2):
                await fresh(kube, rt)
                await rt.run_pass(KEY, False)
            rest = rt.registry.resting[KEY]
            assert rest.due_by - time.monotonic() <= 4, "no deadline"
            before, waits = rt.passes, []
            for _ in range(3):
                wait = await rt.run_pass(KEY, False)
                assert wait is not None
                waits.append(wait)
            skipped = rt.passes - before
            await asyncio.sleep(max(0.0, rest.due_by - time.monotonic()) + 0.05)
            await rt.run_pass(KEY, False)  # the deadline has come: a pass, which rolls back
            return phase, waits, skipped, builders.status_of(kube).get("phase", "")
        finally:
            rt.stop()

    phase, waits, skipped, after = asyncio.run(run())
    assert phase == "Promoting" and skipped == 0
    assert all(0 < w <= 4 for w in waits), waits  # due again at the deadline, not after the 30 s poll
    assert after == "RollingBack"
