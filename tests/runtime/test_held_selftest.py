"""The hold's self-test in the running controller: a runtime takes part once started (it finds the enrolled
Deployment), a change of the result wakes its follow-mode releases so that their Held condition says it at
once, and the loop tests when due, sooner while a refusal waits to be confirmed."""

from __future__ import annotations

import asyncio

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
    woken: list[bool] = []
    seen: list[str | None] = []

    async def sleep(wake: asyncio.Event, seconds: float) -> None:
        seen.append(held_status(kube))
        if len(seen) == 1:  # after the first pass: the webhook goes, the self-test says so
            kube.admit = None
            await asyncio.to_thread(tester.run)
            try:
                await asyncio.wait_for(wake.wait(), 5)
                woken.append(True)
            except TimeoutError:
                woken.append(False)

    async def run() -> Runtime:
        rt = Runtime(kube, tuning=Tuning(threads=2), held=tester)
        try:
            await rt.start_held_selftest()  # tested once, before the first pass
            assert tester.attached and tester.result.status == "True"
            await asyncio.wait_for(rt.run_release(NS, "web", lambda: len(seen) >= 2, sleep), 10)
        finally:
            rt.stop()
        return rt

    rt = asyncio.run(run())
    assert woken == [True] and seen == ["True", "False"]
    assert not tester.attached  # a runtime stopped takes no part any more
    assert rt.registry.following == set()  # its daemon ended


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
