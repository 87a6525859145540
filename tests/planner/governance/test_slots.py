"""The concurrency limit's slots in a Lease on the in-memory API server: taken idempotently, refused when
all are held, stale holders dropped, two takes racing, and a slot freed by its holder only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import Conflict, Ref
from greyrelease.reconcile.slots import free as free_slot
from greyrelease.reconcile.slots import holders_of, lease_path
from greyrelease.reconcile.slots import take as take_slot

from tests.support.builders import NS, T0
from tests.support.governance import LEASE


def member(name: str, uid: str | None = None) -> Obj:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}"}}


def holders(kube: MemoryKube) -> list[str]:
    return [h.name for h in holders_of(kube.get(lease_path(LEASE)))]


def test_take_creates_the_lease_and_is_idempotent() -> None:
    kube = MemoryKube()
    take_slot(kube, LEASE, limit=2, release=member("a"), stale=(), since=T0)
    assert holders(kube) == ["a"]
    held = holders_of(kube.get(lease_path(LEASE)))[0]
    assert (held.uid, held.namespace, held.since) == ("uid-a", NS, "2026-01-01T12:00:00.000Z")
    kube.requests.clear()
    take_slot(kube, LEASE, limit=2, release=member("a"), stale=(), since=T0 + timedelta(seconds=5))
    assert kube.writes == [] and holders(kube) == ["a"]


def test_take_is_refused_when_all_slots_are_held() -> None:
    kube = MemoryKube()
    for name in ("a", "b"):
        take_slot(kube, LEASE, limit=2, release=member(name), stale=(), since=T0)
    kube.requests.clear()
    with pytest.raises(Conflict):
        take_slot(kube, LEASE, limit=2, release=member("c"), stale=(), since=T0)
    assert kube.writes == [] and holders(kube) == ["a", "b"]


def test_stale_holders_are_dropped_in_the_same_write() -> None:
    kube = MemoryKube()
    for name in ("a", "b"):
        take_slot(kube, LEASE, limit=2, release=member(name), stale=(), since=T0)
    kube.requests.clear()
    take_slot(kube, LEASE, limit=2, release=member("c"), stale=("uid-a",), since=T0)
    assert holders(kube) == ["b", "c"]
    assert [verb for verb, _ in kube.writes] == ["PUT"]


def race(kube: MemoryKube, first: Obj, second: Obj, *, verb: str) -> None:
    """``second`` takes a slot; between its read and its write, ``first`` takes one (another controller
    replica, say)."""
    raced = False

    def before(v: str, p: Ref) -> None:
        nonlocal raced
        if v == verb and not raced:
            raced = True
            take_slot(kube, LEASE, limit=2, release=first, stale=(), since=T0)

    kube.before = before
    try:
        take_slot(kube, LEASE, limit=2, release=second, stale=(), since=T0)
    finally:
        kube.before = None


def test_two_takes_racing_for_the_last_slot_one_is_refused() -> None:
    kube = MemoryKube()
    take_slot(kube, LEASE, limit=2, release=member("a"), stale=(), since=T0)
    with pytest.raises(Conflict):
        race(kube, member("b"), member("c"), verb="PUT")
    assert holders(kube) == ["a", "b"]
    # The refused pass, retried, finds the slots taken.
    with pytest.raises(Conflict, match="all 2 slots"):
        take_slot(kube, LEASE, limit=2, release=member("c"), stale=(), since=T0)
    assert holders(kube) == ["a", "b"]


def test_two_takes_racing_to_create_the_lease_both_hold_a_slot_of_two() -> None:
    kube = MemoryKube()
    race(kube, member("a"), member("b"), verb="POST")  # b's create loses (409), b reads again and takes the 2nd
    assert holders(kube) == ["a", "b"]
    posts = [p for v, p in kube.writes if v == "POST"]
    assert len(posts) == 2 and len([v for v, _ in kube.writes if v == "PUT"]) == 1, kube.writes


def test_two_takes_racing_to_create_the_lease_of_one_slot_one_is_refused() -> None:
    kube = MemoryKube()
    raced = False

    def before(v: str, p: Ref) -> None:
        nonlocal raced
        if v == "POST" and not raced:
            raced = True
            take_slot(kube, LEASE, limit=1, release=member("a"), stale=(), since=T0)

    kube.before = before
    try:
        with pytest.raises(Conflict, match="all 1 slots"):
            take_slot(kube, LEASE, limit=1, release=member("b"), stale=(), since=T0)
    finally:
        kube.before = None
    assert holders(kube) == ["a"]


def test_free_gives_back_only_the_slot_held() -> None:
    kube = MemoryKube()
    free_slot(kube, LEASE, uid="uid-a")  # no Lease yet
    assert kube.writes == []
    for name in ("a", "b"):
        take_slot(kube, LEASE, limit=2, release=member(name), stale=(), since=T0)
    kube.requests.clear()
    free_slot(kube, LEASE, uid="uid-z")
    assert kube.writes == [] and holders(kube) == ["a", "b"]
    free_slot(kube, LEASE, uid="uid-a")
    assert holders(kube) == ["b"] and len(kube.writes) == 1
    kube.requests.clear()
    free_slot(kube, LEASE, uid="uid-a")
    assert kube.writes == []
