"""Who may hold the Lease: pure."""

from datetime import UTC, datetime, timedelta
from typing import Any

from greyrelease.runtime.leader import claim

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def held_by(who: str, ago: float) -> dict[str, Any]:
    t = (NOW - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"holderIdentity": who, "leaseDurationSeconds": 10, "renewTime": t, "acquireTime": t, "leaseTransitions": 3}


def test_free_lease_is_taken() -> None:
    spec = claim({}, "a", NOW, 10)
    assert spec is not None and spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0


def test_live_lease_of_another_is_respected() -> None:
    assert claim(held_by("b", 5), "a", NOW, 10) is None


def test_expired_lease_is_taken_over_and_counted() -> None:
    spec = claim(held_by("b", 11), "a", NOW, 10)
    assert spec is not None and spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 4


def test_own_lease_is_renewed_without_a_transition() -> None:
    spec = claim(held_by("a", 2), "a", NOW, 10)
    assert spec is not None and spec["leaseTransitions"] == 3 and spec["renewTime"].startswith("2026-01-01T12:00:00")


def test_released_lease_is_free() -> None:
    spec = claim({**held_by("b", 1), "holderIdentity": ""}, "a", NOW, 10)
    assert spec is not None and spec["holderIdentity"] == "a"


# --- the Lease on the in-memory API server ----------------------------------------------------------


def test_two_candidates_one_holder_and_a_clean_release_frees_the_lease_at_once() -> None:
    from greyrelease.kube.memory import MemoryKube
    from greyrelease.runtime.leader import Lease

    kube = MemoryKube()
    a = Lease(kube, namespace="greyrelease-system", me="a")
    b = Lease(kube, namespace="greyrelease-system", me="b")
    assert a.try_hold() and not b.try_hold()
    assert a.try_hold()  # renewed
    assert b.holder() == "a"
    a.release()
    assert b.try_hold() and not a.try_hold() and a.holder() == "b"


def test_a_candidate_that_read_the_lease_before_another_took_it_over_does_not_take_it() -> None:
    import copy

    from greyrelease.api.release import Obj
    from greyrelease.kube.memory import MemoryKube
    from greyrelease.kube.protocol import Ref
    from greyrelease.runtime.leader import Lease

    kube = MemoryKube()
    old = Lease(kube, namespace="ns", me="old", lease_seconds=1)
    assert old.try_hold()
    expired = kube.get(old.path) or {}
    expired["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"
    kube.put(expired)  # the old leader stopped renewing long ago
    seen = kube.get(old.path) or {}
    assert Lease(kube, namespace="ns", me="c").try_hold()  # c takes it over

    class ReadBeforeTheTakeover(MemoryKube):
        def get(self, ref: Ref) -> Obj | None:
            return copy.deepcopy(seen)

        def replace(self, ref: Ref, body: Obj) -> Obj:
            return kube.replace(ref, body)

    late = ReadBeforeTheTakeover()
    assert not Lease(late, namespace="ns", me="b").try_hold()  # its PUT of the stale version is refused
    assert old.holder() == "c"


def test_the_leader_keeps_its_lease_while_its_event_loop_is_busy_and_steps_down_when_cut_off() -> None:
    import asyncio
    import time

    from greyrelease.kube.memory import MemoryKube
    from greyrelease.runtime.leader import Lease, keep

    kube = MemoryKube()
    cut = [False]

    class Cuttable:
        def __getattr__(self, name: str) -> Any:
            if cut[0]:
                raise ConnectionError("cut off from the API server")
            return getattr(kube, name)

    lease = Lease(Cuttable(), namespace="ns", me="a", lease_seconds=1)
    assert lease.try_hold()

    async def scenario() -> float:
        lost = asyncio.Event()
        keeper = asyncio.create_task(keep(lease, lost, renew_every=0.2))
        await asyncio.sleep(0)
        time.sleep(2.0)  # the loop blocked for two leases: the renewals went on meanwhile
        await asyncio.sleep(0.3)
        assert not lost.is_set()
        renewed = datetime.fromisoformat((kube.get(lease.path) or {})["spec"]["renewTime"].replace("Z", "+00:00"))
        assert (datetime.now(UTC) - renewed).total_seconds() < 1.0
        cut[0] = True
        await asyncio.wait_for(lost.wait(), timeout=10)
        stepped_down = datetime.now(UTC)
        await keeper
        last = datetime.fromisoformat((kube.get(lease.path) or {})["spec"]["renewTime"].replace("Z", "+00:00"))
        return (stepped_down - last).total_seconds()

    stepped_down = asyncio.run(scenario())
    print(f"stepped down {stepped_down:.2f}s after the last renewal (lease 1 s, renewed every 0.2 s)")
    assert stepped_down < 1.0  # before the Lease (1 s after the last renewal) could be taken by another


def test_a_renewal_is_one_write_and_a_lease_written_meanwhile_by_another_is_read_first() -> None:
    from collections import Counter

    from greyrelease.kube.memory import MemoryKube
    from greyrelease.runtime.leader import Lease

    kube = MemoryKube()
    calls: Counter[str] = Counter()

    class Counting:
        def __getattr__(self, name: str) -> Any:
            calls[name] += 1
            return getattr(kube, name)

    a = Lease(Counting(), namespace="ns", me="a", lease_seconds=1)
    assert a.try_hold()
    assert calls == {"get": 1, "create": 1}
    calls.clear()
    assert a.try_hold() and a.try_hold()
    assert calls == {"replace": 2}  # no read before a renewal
    # The Lease expired and b took it: a's renewal of the version it wrote is refused, and a reads it.
    lease = kube.get(a.path) or {}
    lease["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"
    kube.put(lease)
    assert Lease(kube, namespace="ns", me="b", lease_seconds=1).try_hold()
    calls.clear()
    assert not a.try_hold()
    assert calls == {"replace": 1, "get": 1} and a.holder() == "b"


def test_a_renewal_takes_no_lease_given_up_or_taken_since() -> None:
    from greyrelease.kube.memory import MemoryKube
    from greyrelease.runtime.leader import Lease

    kube = MemoryKube()
    a = Lease(kube, namespace="ns", me="a", lease_seconds=1)
    assert not a.try_hold(take=False)  # no Lease yet: nothing to renew
    assert a.try_hold() and a.try_hold(take=False)
    # a was paused past its Lease; b took it and gave it up again: a, back, does not renew it...
    lease = kube.get(a.path) or {}
    lease["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"
    kube.put(lease)
    b = Lease(kube, namespace="ns", me="b", lease_seconds=1)
    assert b.try_hold()
    assert not a.try_hold(take=False)
    b.release()
    assert not a.try_hold(take=False) and a.holder() == ""
    assert a.try_hold()  # ...until it takes it anew
