"""The concurrency limit: the queue's order, a release queued with its position, a slot taken before
anything changes and freed in the pass that ends the release (the planner's side), the queue as read from
the cluster, and two releases under a limit of one through the reconciler."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from greyrelease.api.release import ABORT_ANNOTATION, GreyReleaseSpec, GreyReleaseStatus, Phase
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import FreeSlot, PrepareRouting, SetWeight, TakeSlot
from greyrelease.planner.governance import Queue, queue_order
from greyrelease.planner.machine import decide, progressing
from greyrelease.reconcile.policies import Governing, observe_governance, queue_of, read_queue
from greyrelease.reconcile.reconciler import Reconciler
from greyrelease.reconcile.slots import holders_of, lease_path
from greyrelease.reconcile.slots import take as take_slot

from tests.support.builders import NS, RELEASE, T0, release, roll_out, stable, status_of
from tests.support.governance import LEASE, OFFICE_JSON, SATURDAY, GovWorld, at, gr, reasons
from tests.support.world import spec


def queue(
    *, limit: int = 2, holders: tuple[str, ...] = (), ahead: int = 0, held: bool = False, stale: tuple[str, ...] = ()
) -> Queue:
    return Queue("namespace shop", LEASE, limit, holders, ahead, held, stale)


def test_queue_order_is_creation_then_namespace_then_name() -> None:
    same = at("2026-01-01T12:00:00Z")
    keys = [
        ("z-early", queue_order(same - timedelta(seconds=1), "b", "z")),
        ("b-a", queue_order(same, "b", "a")),
        ("a-b", queue_order(same, "a", "b")),
        ("a-a", queue_order(same, "a", "a")),
        ("none", queue_order(None, "a", "a")),
        ("late", queue_order(same + timedelta(seconds=1), "a", "a")),
    ]
    assert [n for n, _ in sorted(keys, key=lambda k: k[1])] == ["z-early", "a-a", "a-b", "b-a", "late", "none"]


@pytest.mark.parametrize(
    ("q", "free", "may"),
    [
        (queue(limit=2), 2, True),
        (queue(limit=2, holders=("x",)), 1, True),
        (queue(limit=2, holders=("x",), ahead=1), 1, False),
        (queue(limit=2, ahead=1), 2, True),
        (queue(limit=2, holders=("x", "y")), 0, False),
        (queue(limit=1, holders=("x", "y")), 0, False),
        (queue(limit=2, holders=("release-uid",), held=True), 1, False),
    ],
    ids=["empty", "one-free", "one-free-one-ahead", "two-free-one-ahead", "full", "over-full", "held-already"],
)
def test_queue_may_take(q: Queue, free: int, may: bool) -> None:
    assert q.free == free
    assert q.may_take() is may


def test_under_a_full_limit_a_release_is_queued_with_its_position() -> None:
    w = GovWorld(spec(), queue=queue(holders=("a", "b"), ahead=2))
    plan = w.step()
    st = plan.status
    assert (st.phase, st.queue_position, st.batch) == (Phase.QUEUED, 3, "queued #3")
    assert st.message == "position 3 in the queue of namespace shop (at most 2 progressing)"
    assert plan.actions == ()
    assert reasons(plan) == [R.QUEUED]
    assert not progressing(st)
    # Nothing changes: no Event, no status change.
    w.now += timedelta(seconds=30)
    again = w.step()
    assert again.status == st and again.events == () and again.actions == ()
    # One ahead of it took a slot: a new position, announced by the status only.
    w.queue = queue(holders=("a", "b"), ahead=1)
    moved = w.step()
    assert (moved.status.queue_position, moved.status.batch) == (2, "queued #2")
    assert moved.events == ()


def test_a_free_slot_is_taken_before_anything_is_changed() -> None:
    w = GovWorld(spec(), queue=queue(holders=("a", "b"), ahead=0))
    assert w.step().status.phase == Phase.QUEUED
    w.queue = queue(holders=("a",), ahead=0, stale=("gone",))
    plan = w.step()
    assert plan.actions[0] == TakeSlot(LEASE, 2, "namespace shop", w.now, ("gone",))
    assert plan.actions[1] == PrepareRouting()
    st = plan.status
    assert (st.phase, st.current_batch, st.queue_position, st.batch) == (Phase.PROGRESSING, 1, None, "1/5")
    assert progressing(st)
    # Held from now on: no second TakeSlot.
    assert not any(isinstance(a, TakeSlot) for a in w.step().actions)


def test_a_slot_is_not_taken_while_the_window_is_closed() -> None:
    w = GovWorld(spec(windows=[OFFICE_JSON]), queue=queue(), now=SATURDAY)
    plan = w.step()
    assert plan.status.phase == Phase.WAITING and plan.actions == ()


def held_run(**fields: Any) -> GovWorld:
    """A release under a limit that took its slot in its first pass."""
    w = GovWorld(spec(**fields), queue=queue(holders=("a",)))
    assert isinstance(w.step().actions[0], TakeSlot)
    assert w.queue is not None and w.queue.held
    return w


def frees(w: GovWorld) -> list[int]:
    """The passes that planned FreeSlot."""
    return [i for i, p in enumerate(w.plans) if FreeSlot(LEASE) in p.actions]


def test_a_release_that_succeeds_frees_its_slot_in_the_pass_that_ends_it() -> None:
    w = held_run()
    w.run(until={Phase.SUCCEEDED})
    assert frees(w) == [len(w.plans) - 1]
    assert w.queue is not None and not w.queue.held


def rolled_back_at_once(w: GovWorld) -> None:
    """The pass that cuts the traffic (and decides the rollback) gives the slot back, after the traffic is
    cut; the passes that restore the app after it hold no slot."""
    w.now += timedelta(seconds=1)
    cut = w.step()
    assert cut.status.phase == Phase.ROLLING_BACK
    assert cut.actions == (SetWeight(0), FreeSlot(LEASE))
    assert not progressing(cut.status)
    assert frees(w) == [len(w.plans) - 1]


def test_a_release_that_is_aborted_frees_its_slot_at_once() -> None:
    w = held_run(pause="1h")
    w.step()
    w.annotations[ABORT_ANNOTATION] = "true"
    rolled_back_at_once(w)
    w.run(until={Phase.ABORTED})
    assert len(frees(w)) == 1


def test_a_release_that_fails_frees_its_slot_at_once() -> None:
    w = held_run(pause="1h")
    w.step()
    w.stable = None  # the target Deployment is deleted
    rolled_back_at_once(w)
    w.run(until={Phase.FAILED})
    assert w.status.message.startswith("the target Deployment 'web' is gone") and len(frees(w)) == 1


def test_a_deleted_release_frees_its_slot_at_once() -> None:
    w = held_run(pause="1h")
    w.step()
    w.deleting = True
    first = w.step()
    assert first.actions[0] == SetWeight(0) and first.actions[-1] == FreeSlot(LEASE)
    for _ in range(10):
        w.advance(10)
        plan = w.step()
        if plan.done:
            break
    assert plan.done and w.canary is None
    assert frees(w) == [w.plans.index(first)]


def test_a_queued_release_that_is_aborted_frees_nothing() -> None:
    w = GovWorld(spec(), queue=queue(holders=("a", "b")))
    w.step()
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.status.phase == Phase.ABORTED and plan.actions == ()


# --- the queue as read from the cluster -------------------------------------------------------------


SETTINGS = Governing(max_progressing=2)


def test_releases_created_in_the_same_second_queue_by_name() -> None:
    names = ["e", "c", "a", "d", "b"]
    kube = MemoryKube(*(gr(n) for n in names))
    ref = queue_of(gr("a"), [], SETTINGS)
    assert ref is not None and ref.limit == 2
    assert all(queue_of(gr(n), [], SETTINGS) == ref for n in names)
    seen = {n: read_queue(kube, gr(n), ref, [], SETTINGS) for n in names}
    assert {n: q.ahead + 1 for n, q in seen.items()} == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    assert [n for n in sorted(names) if seen[n].may_take()] == ["a", "b"]
    # a and b take their slots and start; the others queue behind them, in the order of their names.
    for n in ("a", "b"):
        plan = decide(
            GreyReleaseSpec.model_validate(gr(n)["spec"]),
            GreyReleaseStatus(),
            replace(GovWorld(spec()).observed(), queue=seen[n]),
            T0,
        )
        take = plan.actions[0]
        assert isinstance(take, TakeSlot)
        take_slot(kube, take.lease, limit=take.limit, release=gr(n), stale=take.stale, since=take.since)
        kube.put(gr(n, status={"phase": "Progressing", "phaseStartedAt": "2026-01-01T12:00:00.000Z"}))
    assert [h.name for h in holders_of(kube.get(lease_path(ref.lease)))] == ["a", "b"]
    for position, n in enumerate(["c", "d", "e"], start=1):
        q = read_queue(kube, gr(n), ref, [], SETTINGS)
        assert (q.holders, q.ahead, q.may_take()) == (("uid-a", "uid-b"), position - 1, False)
        plan = GovWorld(spec(), queue=q).step()
        assert (plan.status.phase, plan.status.batch) == (Phase.QUEUED, f"queued #{position}")


def test_an_earlier_release_is_ahead_whatever_its_name() -> None:
    kube = MemoryKube(gr("a"), gr("b"), gr("z", "2026-01-01T11:59:59Z"))
    ref = queue_of(gr("a"), [], SETTINGS)
    assert ref is not None
    assert read_queue(kube, gr("z", "2026-01-01T11:59:59Z"), ref, [], SETTINGS).ahead == 0
    assert read_queue(kube, gr("a"), ref, [], SETTINGS).ahead == 1


def test_a_holder_that_ended_is_stale_and_its_slot_is_taken_over() -> None:
    done = {"phase": "Succeeded", "phaseStartedAt": "2026-01-01T13:00:00.000Z"}
    kube = MemoryKube(gr("a", status=done), gr("b", status={"phase": "Progressing"}), gr("c"))
    ref = queue_of(gr("c"), [], SETTINGS)
    assert ref is not None
    for n in ("a", "b"):
        take_slot(kube, ref.lease, limit=2, release=gr(n), stale=(), since=T0)
    q = read_queue(kube, gr("c"), ref, [], SETTINGS)
    assert (q.stale, q.holders, q.may_take()) == (("uid-a",), ("uid-b",), True)
    take_slot(kube, ref.lease, limit=2, release=gr("c"), stale=q.stale, since=T0 + timedelta(hours=2))
    assert [h.name for h in holders_of(kube.get(lease_path(ref.lease)))] == ["b", "c"]


def test_a_progressing_release_does_not_read_the_queue() -> None:
    kube = MemoryKube(gr("a", status={"phase": "Progressing"}))
    status = GreyReleaseStatus.model_validate(
        {"phase": "Progressing", "batchState": "Verifying", "restore": {"replicas": 2, "image": "app:v1"}}
    )
    kube.requests.clear()
    seen = observe_governance(kube, gr("a"), GreyReleaseSpec.model_validate(gr("a")["spec"]), status, {}, SETTINGS)
    assert seen.queue is not None and seen.queue.held
    assert not any(p.resource == "leases" for _, p in kube.requests)


# --- through the reconciler, on the in-memory API server --------------------------------------------


def second_app(kube: MemoryKube, name: str, created: str) -> None:
    """Another Deployment and its GreyRelease in the namespace."""
    app = stable()
    app["metadata"] = {**app["metadata"], "name": name, "uid": f"{name}-uid"}
    kube.put(app)
    rel = release()
    rel["metadata"] = {**rel["metadata"], "name": name, "uid": f"{name}-release-uid", "creationTimestamp": created}
    rel["spec"] = {**rel["spec"], "targetRef": {"name": name}}
    kube.put(rel)
    roll_out(kube)


def leases(kube: MemoryKube) -> list[list[str]]:
    return [[h.name for h in holders_of(o)] for o in kube.objects() if o.get("kind") == "Lease"]


def test_under_a_limit_of_one_the_second_release_queues_and_starts_when_the_first_is_aborted() -> None:
    kube = MemoryKube(stable(), release())
    web = kube.get(RELEASE)
    assert web is not None
    kube.put({**web, "metadata": {**web["metadata"], "creationTimestamp": "2026-01-01T11:00:00Z"}})
    roll_out(kube)
    second_app(kube, "api", "2026-01-01T11:00:01Z")
    reconciler = Reconciler(kube, governing=Governing(max_progressing=1))
    reconciler.reconcile(NS, "web", now=T0)
    assert status_of(kube)["phase"] == "Progressing" and leases(kube) == [["web"]]
    reconciler.reconcile(NS, "api", now=T0)
    api = dict((kube.get(path("greyrelease.io", "v1", "greyreleases", NS, "api")) or {}).get("status") or {})
    assert (api["phase"], api["queuePosition"], api["batch"]) == ("Queued", 1, "queued #1")
    assert kube.get(path("apps", "v1", "deployments", NS, "api-canary")) is None
    # The first is aborted: its slot is given back in the pass that cuts its traffic.
    kube.patch(RELEASE, {"metadata": {"annotations": {"greyrelease.io/abort": "true"}}})
    reconciler.reconcile(NS, "web", now=T0 + timedelta(seconds=10))
    assert status_of(kube)["phase"] == "RollingBack" and leases(kube) == [[]]
    reconciler.reconcile(NS, "api", now=T0 + timedelta(seconds=10))
    api = dict((kube.get(path("greyrelease.io", "v1", "greyreleases", NS, "api")) or {}).get("status") or {})
    assert api["phase"] == "Progressing" and "queuePosition" not in api
    assert leases(kube) == [["api"]]
