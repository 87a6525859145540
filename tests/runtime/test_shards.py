"""Shards: the API server's hash and ranges, the fair share, and two replicas holding shards through Leases
on the in-memory API server (one of them cut off: the other takes its shard over, never while it may
still write)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.runtime.shards import (
    SPACE,
    Held,
    Moves,
    Shards,
    bounds,
    decide,
    fnv1a64,
    lease_name,
    older_other_count,
    selector,
    shard_of,
)


def test_the_hash_is_fnv_1a_64_as_the_api_server_computes_it() -> None:
    # The FNV specification's test vectors.
    assert fnv1a64("") == 0xCBF29CE484222325
    assert fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a64("foobar") == 0x85944171F73967E8


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_the_ranges_cover_the_hash_space_without_overlap(n: int) -> None:
    ranges = [bounds(k, n) for k in range(n)]
    assert ranges[0][0] == 0 and ranges[-1][1] == SPACE
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(ranges))
    for namespace in ("default", "payments", "shop", "team-a", "kube-system"):
        k = shard_of(namespace, n)
        assert bounds(k, n)[0] <= fnv1a64(namespace) < bounds(k, n)[1]


def test_the_selector_names_each_range_in_the_api_servers_notation() -> None:
    assert selector([0], 1) == ("shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')")
    assert selector([2, 0], 3) == (
        "shardRange(object.metadata.namespace, '0x0000000000000000', '0x5555555555555555') || "
        "shardRange(object.metadata.namespace, '0xaaaaaaaaaaaaaaaa', '0x10000000000000000')"
    )
    with pytest.raises(ValueError):
        selector([], 3)
    with pytest.raises(ValueError):
        bounds(3, 3)


def test_replicas_started_together_try_different_shards_first() -> None:
    members = ["a", "b", "c"]
    free = {0: "", 1: "", 2: ""}
    takes = [decide(3, me, free, members).take for me in members]
    assert takes == [(0,), (1,), (2,)]


def test_a_replica_takes_up_to_its_fair_share_and_gives_back_what_is_over_it() -> None:
    # b died: its shard is free and a and c may hold two each; both try, the Lease decides.
    assert decide(3, "a", {0: "a", 1: "", 2: "c"}, ["a", "c"]) == Moves(take=(1,))
    assert decide(3, "c", {0: "a", 1: "", 2: "c"}, ["a", "c"]) == Moves(take=(1,))
    # a holds everything and two more replicas joined: one shard a round goes back.
    assert decide(3, "a", {0: "a", 1: "a", 2: "a"}, ["a", "b", "c"]) == Moves(give=(2,))
    # A new replica finds nothing free: it waits for a shard to be handed over.
    assert decide(3, "b", {0: "a", 1: "a", 2: "c"}, ["a", "b", "c"]) == Moves()
    # Alone: every shard (it counts itself when not yet listed).
    assert decide(2, "a", {0: "", 1: ""}, []) == Moves(take=(0, 1))


class Cuttable:
    """One replica's way to the shared in-memory API server; ``cut`` makes every request fail, as a
    replica partitioned from the API server sees it."""

    def __init__(self, kube: MemoryKube) -> None:
        self.kube = kube
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.kube, name)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.cut:
                raise ConnectionError("cut off from the API server")
            return call(*args, **kwargs)

        return guarded


def test_a_replica_cut_off_stops_writing_before_another_takes_its_shard_over() -> None:
    kube = MemoryKube()
    ways = {"a": Cuttable(kube), "b": Cuttable(kube)}
    running: dict[str, dict[int, Held]] = {"a": {}, "b": {}}
    taken: list[tuple[str, int, float]] = []
    overlaps: list[tuple[int, float]] = []

    def replica(me: str) -> Shards:
        flags: dict[int, asyncio.Event] = {}

        async def start(k: int, held: Held) -> None:
            running[me][k] = held
            taken.append((me, k, time.time()))
            flags[k] = asyncio.Event()
            await flags[k].wait()  # an operator runs until told to stop

        async def stop(k: int) -> None:
            running[me].pop(k, None)
            flags.pop(k).set()

        return Shards(
            ways[me],
            namespace="system",
            n=2,
            me=me,
            start=start,
            stop=stop,
            lease_seconds=1,
            renew_every=0.2,
        )

    async def scenario() -> float:
        stopping = asyncio.Event()
        a, b = replica("a"), replica("b")
        loops = [asyncio.create_task(a.run(stopping)), asyncio.create_task(b.run(stopping))]

        async def watch() -> None:
            while True:
                for k in (0, 1):
                    writers = [me for me in running if k in running[me] and running[me][k].writable()]
                    if len(writers) > 1:
                        overlaps.append((k, time.monotonic()))
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(1.5)
        assert {k for held in running.values() for k in held} == {0, 1}
        assert len(running["a"]) == 1 and len(running["b"]) == 1
        lost = next(iter(running["b"]))
        ways["b"].cut = True
        # b's last renewal: its Lease runs out 1 s after it, however late that renewal came on a busy machine.
        lease = kube.get(path("coordination.k8s.io", "v1", "leases", "system", lease_name(lost, 2)))
        assert lease is not None and lease["spec"]["holderIdentity"] == "b"
        renewed = datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00")).timestamp()
        for _ in range(1000):  # a generous limit: the Lease lasts 1 s
            if set(running["a"]) == {0, 1}:
                break
            await asyncio.sleep(0.01)
        assert set(running["a"]) == {0, 1}, running
        assert running["b"] == {}
        moved_at = next(t for me, k, t in taken if me == "a" and k == lost)
        ways["b"].cut = False
        stopping.set()
        await asyncio.gather(*loops)
        watcher.cancel()
        return moved_at - renewed

    moved = asyncio.run(scenario())
    print(f"shard taken over {moved:.2f}s after its holder's last renewal (lease 1 s, renewed every 0.2 s)")
    assert overlaps == []  # b refused writes before a took its shard (sampled every 10 ms)
    assert moved >= 1.0  # not before b's Lease expired
    # Every Lease was given up or deleted on the clean stop.
    leases = kube.objects(path("coordination.k8s.io", "v1", "leases", "system"))
    assert [lease["metadata"]["name"] for lease in leases if lease["spec"].get("holderIdentity")] == []


def test_a_replica_whose_event_loop_is_busy_keeps_its_shards() -> None:
    # A replica starting thousands of releases keeps its event loop busy for seconds at a time. Its Leases
    # are renewed on threads of their own, so its shards stay writable (and held) all along; renewed
    # through the loop, they stopped being writable 0.8 s into the block.
    kube = MemoryKube()
    seen: list[bool] = []
    flags: dict[int, asyncio.Event] = {}

    async def start(k: int, held: Held) -> None:
        flags[k] = asyncio.Event()
        await flags[k].wait()  # an operator runs until told to stop

    async def stop(k: int) -> None:
        flags.pop(k).set()

    async def scenario() -> None:
        stopping = asyncio.Event()
        shards = Shards(kube, namespace="system", n=1, me="a", start=start, stop=stop, lease_seconds=1, renew_every=0.2)
        loop = asyncio.create_task(shards.run(stopping))
        for _ in range(500):
            if shards.held:
                break
            await asyncio.sleep(0.01)
        held = shards.held[0]
        end = time.monotonic() + 2.5  # the loop blocked for 2.5 leases
        while time.monotonic() < end:
            seen.append(held.writable())
            time.sleep(0.01)
        await asyncio.sleep(0.5)
        assert 0 in shards.held
        stopping.set()
        await loop

    asyncio.run(scenario())
    assert len(seen) > 100 and all(seen), f"unwritable in {seen.count(False)} of {len(seen)} samples"


def test_a_dropped_shard_stays_unwritable_whatever_a_renewal_under_way_reports() -> None:
    held = Held(0, time.monotonic(), 10, 2.0)
    assert held.writable()
    held.drop()
    held.renew(time.monotonic())  # the renewing thread's attempt began before the drop and ended after it
    assert not held.writable()
    fresh = Held(1, time.monotonic() - 9, 10, 2.0)
    assert not fresh.writable()
    fresh.renew(time.monotonic())
    assert fresh.writable()
    fresh.renew(time.monotonic() - 9)  # an older attempt ending late does not move the renewal back
    assert fresh.writable()


def member(holder: str, count: int, joined: str, renewed: str = "2026-12-04T10:00:05Z") -> dict[str, Any]:
    return {
        "metadata": {"name": f"greyrelease-member-{holder}", "labels": {"greyrelease.io/member": str(count)}},
        "spec": {"holderIdentity": holder, "acquireTime": joined, "renewTime": renewed, "leaseDurationSeconds": 10},
    }


def test_replicas_run_with_another_shard_count_hold_the_releases_while_they_started_first() -> None:
    now = datetime(2026, 12, 4, 10, 0, 10, tzinfo=UTC)
    old = member("old", 3, "2026-12-04T09:00:00Z")
    new = member("new", 4, "2026-12-04T10:00:00Z")
    # The newer group waits for the older one (a rolling update from --shards 3 to --shards 4)...
    assert older_other_count([old, new], "new", 4, now) == ["old (--shards 3)"]
    # ...which goes on as if the newer one were not there.
    assert older_other_count([old, new], "old", 3, now) == []
    # A member of the other count that is no longer renewed is not waited for.
    gone = member("old", 3, "2026-12-04T09:00:00Z", renewed="2026-12-04T09:59:00Z")
    assert older_other_count([gone, new], "new", 4, now) == []


def test_a_replica_takes_nothing_while_an_older_replica_runs_with_another_shard_count() -> None:
    kube = MemoryKube()
    kube.put(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "greyrelease-member-old",
                "namespace": "system",
                "labels": {"greyrelease.io/member": "3"},
            },
            "spec": {
                "holderIdentity": "old",
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "leaseDurationSeconds": 30,
            },
        }
    )
    started: list[int] = []

    async def start(k: int, held: Held) -> None:
        started.append(k)

    async def stop(k: int) -> None:
        pass

    async def scenario() -> None:
        stopping = asyncio.Event()
        shards = Shards(
            kube, namespace="system", n=2, me="new", start=start, stop=stop, lease_seconds=1, renew_every=0.1
        )
        loop = asyncio.create_task(shards.run(stopping))
        await asyncio.sleep(0.6)
        assert started == [] and shards.held == {}
        kube.delete(path("coordination.k8s.io", "v1", "leases", "system", "greyrelease-member-old"))
        for _ in range(500):
            if len(started) == 2:
                break
            await asyncio.sleep(0.01)
        stopping.set()
        await loop

    asyncio.run(scenario())
    assert sorted(started) == [0, 1]


def test_the_command_line_refuses_shards_without_leases_and_tells_where_a_namespace_falls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from greyrelease.cli.main import main

    assert main(["run", "--shards", "2", "--no-leader-elect"]) == 2
    assert "--no-leader-elect" in capsys.readouterr().err
    assert main(["shards", "3", "default", "kube-node-lease"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["default\t2", "kube-node-lease\t0"]
    # A local API server asked for the lower half of the hash space listed kube-node-lease's objects, and for
    # the upper half those of default: their hashes are 0x021f... and 0xebad....
    assert err.startswith("per shard: ")


def test_a_shards_operator_that_stops_cancels_no_task_of_the_other_shards() -> None:
    # kopf.operator ends with run_tasks, which waits 5 s for every task of its loop made after the operator
    # started and then cancels those still running, whoever made them. Two shards' operators on one loop:
    # the one handed over cancelled the other's passes under way (at 10,000 releases over 3 replicas, 24
    # releases were never passed again). On a thread and a loop of its own, it reaps its own tasks only.
    from greyrelease.runtime.sharded import on_own_thread
    from kopf._core.reactor.running import run_tasks

    async def operator(stop: threading.Event) -> None:  # kopf.operator's start and end, without a cluster
        existing = asyncio.all_tasks()
        root = asyncio.create_task(asyncio.to_thread(stop.wait))
        await run_tasks([root], ignored=existing)

    async def other_shards_pass() -> str:
        await asyncio.sleep(5.5)  # a pass still under way 5 s after the stop
        return "passed"

    async def scenario(own_thread: bool) -> str:
        stop = threading.Event()
        if own_thread:
            shard = asyncio.create_task(on_own_thread(lambda: asyncio.run(operator(stop)), "shard 1"))
        else:
            shard = asyncio.create_task(operator(stop))
        await asyncio.sleep(0.1)
        passing = asyncio.create_task(other_shards_pass())  # made after the shard's operator started
        await asyncio.sleep(0.1)
        stop.set()  # the shard is handed over
        await shard
        try:
            return await passing
        except asyncio.CancelledError:
            return "cancelled"

    assert asyncio.run(scenario(own_thread=False)) == "cancelled"  # the hazard, as kopf has it
    assert asyncio.run(scenario(own_thread=True)) == "passed"
