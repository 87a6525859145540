"""The hold's self-test in the running controller: a runtime takes part once started (it finds the enrolled
Deployment), a change of the result wakes its follow-mode releases so that their Held condition says it at
once, and the loop tests when due, sooner while a refusal waits to be confirmed."""

from __future__ import annotations

import asyncio
from typing import Any

from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.reconcile.held import HeldSelfTest
from greyrelease.runtime.controller import Runtime, Tuning
from greyrelease.runtime.held import keep_testing

from tests.support.builders import NS, status_of
from tests.support.follow_cluster import WEB, cluster


def held_status(kube: MemoryKube) -> str | None:
    found = [c["status"] for c in status_of(kube).get("conditions") or [] if c["type"] == "Held"]
    return found[0] if found else None


def test_a_changed_result_wakes_the_follow_mode_releases_and_their_next_pass_shows_it() -> None:
    kube = cluster()
    tester = HeldSelfTest(kube, confirmations=0)
    seen: list[str | None] = []

    class Watched(Runtime):
        async def run_pass(self, key: tuple[str, str], urgent: bool) -> float | None:
            after = await super().run_pass(key, urgent)
            seen.append(held_status(kube))
            return after

    async def run() -> None:
        rt = Watched(kube, tuning=Tuning(threads=2), held=tester)
        try:
            await rt.start_held_selftest()  # tested once, before the first pass
            assert tester.attached and tester.result.status == "True"
            rt.scheduler.add((NS, "web"))
            while not seen:
                await asyncio.sleep(0.01)
            assert (rt.scheduler.due((NS, "web")) or 0) > 60  # nothing but the wake-up would pass it again soon
            kube.admit = None  # the webhook goes, the self-test says so
            await asyncio.to_thread(tester.run)
            async with asyncio.timeout(5):
                while len(seen) < 2:
                    await asyncio.sleep(0.01)
        finally:
            await rt.drain()
            rt.stop()

    asyncio.run(run())
    assert seen == ["True", "False"]
    assert not tester.attached  # a runtime stopped takes no part any more


def test_a_result_changed_during_a_release_s_first_pass_wakes_it_too() -> None:
    # A release is known to follow its Deployment once its first pass ended; a first pass that read the old
    # result and ended after the change must still be followed by one that shows the new one.
    kube = cluster()
    tester = HeldSelfTest(kube, confirmations=0)
    seen: list[str | None] = []
    gate = asyncio.Event()

    class Watched(Runtime):
        async def reconcile(self, namespace: str, name: str, *, urgent: bool = False, abort: bool = False) -> Any:
            outcome = await super().reconcile(namespace, name, urgent=urgent, abort=abort)
            seen.append(held_status(kube))
            await gate.wait()  # the first pass is still under way when the result changes
            return outcome

    async def run() -> None:
        rt = Watched(kube, tuning=Tuning(threads=2), held=tester)
        try:
            await rt.start_held_selftest()
            rt.scheduler.add((NS, "web"))
            while not seen:
                await asyncio.sleep(0.01)
            assert (NS, "web") not in rt.registry.following  # its first pass has not ended
            kube.admit = None
            await asyncio.to_thread(tester.run)
            await asyncio.sleep(0.05)  # the wake-up, handed to the loop by the testing thread
            gate.set()
            async with asyncio.timeout(5):
                while len(seen) < 2:
                    await asyncio.sleep(0.01)
        finally:
            gate.set()
            await rt.drain()
            rt.stop()

    asyncio.run(run())
    assert seen == ["True", "False"]


def test_the_loop_tests_when_due_and_not_while_no_runtime_takes_part() -> None:
    kube = cluster()
    calls: list[str] = []
    tester = HeldSelfTest(kube, every=0.2, confirmations=0)

    def finder() -> Obj | None:
        calls.append("find")
        return kube.get(WEB)

    async def run() -> None:
        task = asyncio.create_task(keep_testing(tester, look=0.05))
        await asyncio.sleep(0.2)
        assert calls == []  # nobody takes part: nothing tested
        tester.attach(finder, lambda: None)
        await asyncio.sleep(0.5)
        task.cancel()

    asyncio.run(run())
    assert 2 <= len(calls) <= 4  # at once, then every 0.2 s
    assert tester.result.status == "True"
    assert [verb for verb, ref in kube.requests if ref == WEB].count(MemoryKube.DRY_RUN) == len(calls)
