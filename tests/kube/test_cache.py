"""The read cache: which body wins, what a relist keeps, what the caching Kube reads and folds, and the
watch events that feed it."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from greyrelease.kube.cache import CachedKube, Reflector, Store
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import ApiError, NotFound, Ref, path
from tenacity import wait_fixed


def obj(name: str, rv: int | str, ns: str = "default", **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": ns, "resourceVersion": str(rv), "managedFields": [{"manager": "x"}]}
    return {"metadata": meta, **extra}


def present(found: dict[str, Any] | None) -> dict[str, Any]:
    """``found``, which the test knows is there."""
    assert found is not None
    return found


def version_of(store: Store, name: str, ns: str = "default") -> str | None:
    found = store.get(ns, name)
    return found["metadata"]["resourceVersion"] if found else None


@pytest.mark.parametrize("packed", [False, True])
def test_newer_resource_version_wins_in_either_order(packed: bool) -> None:
    store = Store(packed=packed)
    assert store.fold(obj("web", 5))
    assert not store.fold(obj("web", 4))  # a late watch event does not roll our write back
    assert version_of(store, "web") == "5"
    assert store.fold(obj("web", 7))
    assert version_of(store, "web") == "7"


@pytest.mark.parametrize("packed", [False, True])
def test_bodies_are_kept_without_managed_fields_and_handed_out_as_copies(packed: bool) -> None:
    store = Store(packed=packed)
    store.fold(obj("web", 1, spec={"replicas": 3}))
    got = store.get("default", "web")
    assert got is not None and "managedFields" not in got["metadata"]
    got["spec"]["replicas"] = 99
    assert present(store.get("default", "web"))["spec"]["replicas"] == 3


@pytest.mark.parametrize("packed", [False, True])
def test_deletion_is_not_undone_by_an_older_write_response(packed: bool) -> None:
    store = Store(packed=packed)
    store.fold(obj("web", 3))
    store.delete(obj("web", 6))
    assert store.get("default", "web") is None
    assert not store.fold(obj("web", 5))  # our patch, answered before the deletion, folded after it
    assert store.get("default", "web") is None
    assert store.fold(obj("web", 9))  # created again
    assert version_of(store, "web") == "9"


@pytest.mark.parametrize("packed", [False, True])
def test_deletion_older_than_the_held_body_is_ignored(packed: bool) -> None:
    store = Store(packed=packed)
    store.fold(obj("web", 10))
    store.delete(obj("web", 8))
    assert version_of(store, "web") == "10"


@pytest.mark.parametrize("packed", [False, True])
def test_the_version_held_is_told_without_parsing_and_every_change_is_counted(packed: bool) -> None:
    store = Store(packed=packed)
    assert store.version("default", "web") is None and store.changes == 0
    store.fold(obj("web", 5))
    assert store.version("default", "web") == "5" and store.changes == 1
    assert not store.fold(obj("web", 4))  # older: nothing changes, nothing counted
    assert store.version("default", "web") == "5" and store.changes == 1
    store.delete(obj("web", 6))
    assert store.version("default", "web") is None and store.changes == 2
    store.replace([obj("web", 8)], 8)
    assert store.version("default", "web") == "8" and store.changes == 3
    store.fold(obj("api", "not-a-number"))
    assert store.version("default", "api") is None  # no version to compare: never taken as unchanged


@pytest.mark.parametrize("packed", [False, True])
def test_relist_replaces_the_copy_but_keeps_newer_writes(packed: bool) -> None:
    store = Store(packed=packed)
    store.fold(obj("gone", 2))  # deleted while no watch was open
    store.fold(obj("ours", 12))  # written by us after the list was served
    store.fold(obj("web", 3))
    store.replace([obj("web", 4), obj("new", 5)], version=10)
    assert store.get("default", "gone") is None
    assert version_of(store, "ours") == "12"
    assert version_of(store, "web") == "4"
    assert version_of(store, "new") == "5"
    assert len(store) == 3


@pytest.mark.parametrize("packed", [False, True])
def test_relist_does_not_bring_back_an_object_deleted_after_it(packed: bool) -> None:
    store = Store(packed=packed)
    store.delete(obj("web", 11))
    store.replace([obj("web", 4)], version=10)
    assert store.get("default", "web") is None


@pytest.mark.parametrize("packed", [False, True])
def test_non_numeric_versions_fall_back_to_arrival_order(packed: bool) -> None:
    store = Store(packed=packed)
    store.fold(obj("web", "abc"))
    assert store.fold(obj("web", "abd"))
    assert version_of(store, "web") == "abd"


@pytest.mark.parametrize("packed", [False, True])
def test_namespaces_are_kept_apart(packed: bool) -> None:
    store = Store(packed=packed)
    store.fold(obj("web", 1, ns="a"))
    assert store.get("b", "web") is None
    assert store.get("a", "web") is not None


def test_a_packed_store_holds_json_and_hands_out_the_same_bodies() -> None:
    body = obj(
        "web",
        3,
        spec={"replicas": 3, "template": {"spec": {"containers": [{"name": "app", "image": "a:v1"}]}}},
        status={"ratio": 0.25, "ready": True, "note": None, "name": "ü"},
    )
    plain, packed = Store(), Store(packed=True)
    plain.fold(body)
    packed.fold(body)
    assert isinstance(packed._objects["default", "web"][1], bytes)
    assert (
        packed.get("default", "web")
        == plain.get("default", "web")
        == {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "managedFields"}}
    )
    assert packed.values() == plain.values()


DEPLOYMENTS = path("apps", "v1", "deployments", "default")


def deployment(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


@pytest.fixture
def cached() -> tuple[CachedKube, MemoryKube, Store]:
    """A client whose reads of Deployments come from a store, on an empty in-memory API server."""
    api = MemoryKube()
    client = CachedKube(api)
    store = Store()
    client.cache(DEPLOYMENTS, store)
    return client, api, store


def test_reads_come_from_the_store_and_fall_back_to_the_api(cached: tuple[CachedKube, MemoryKube, Store]) -> None:
    client, api, store = cached
    store.fold({**obj("web", 5), "spec": {"replicas": 2}})
    assert present(client.get(DEPLOYMENTS.named("web")))["spec"] == {"replicas": 2}
    assert api.requests == []
    api.put(deployment("other"))
    assert client.get(DEPLOYMENTS.named("other")) is not None
    assert api.requests == [("GET", DEPLOYMENTS.named("other"))]
    assert client.get(DEPLOYMENTS.named("other")) is not None  # kept from the first answer
    assert len(api.requests) == 1
    assert client.get(DEPLOYMENTS.named("missing")) is None
    assert (client.hits, client.misses) == (2, 2)
    # Not found is remembered: asked again, nothing goes to the API server until the watch brings it.
    assert client.get(DEPLOYMENTS.named("missing")) is None
    assert len(api.requests) == 2 and (client.hits, client.misses) == (3, 2)
    store.fold(obj("missing", 7))
    assert client.get(DEPLOYMENTS.named("missing")) is not None and len(api.requests) == 2


def test_a_deleted_object_is_answered_from_memory_without_asking(cached: tuple[CachedKube, MemoryKube, Store]) -> None:
    client, api, _ = cached
    client.create(DEPLOYMENTS, {"metadata": {"name": "web-canary"}})
    client.delete(DEPLOYMENTS.named("web-canary"))  # the promotion removes the canary
    api.requests.clear()
    for _ in range(3):
        assert client.get(DEPLOYMENTS.named("web-canary")) is None
    assert api.requests == []
    # Created again (by us): served from the create's answer.
    client.create(DEPLOYMENTS, {"metadata": {"name": "web-canary"}})
    assert client.get(DEPLOYMENTS.named("web-canary")) is not None


def test_a_not_found_answer_does_not_hide_a_body_folded_meanwhile() -> None:
    store = Store()
    store.fold(obj("web", 5))  # the watch brought it while a GET was on its way
    store.mark_absent("default", "web")  # that GET's late 404
    assert store.get("default", "web") is not None and not store.absent("default", "web")


def test_writes_fold_their_responses(cached: tuple[CachedKube, MemoryKube, Store]) -> None:
    client, api, store = cached
    created = client.create(DEPLOYMENTS, {"metadata": {"name": "web"}, "spec": {"replicas": 1}})
    version = int(created["metadata"]["resourceVersion"])
    assert version_of(store, "web") == str(version)
    store.fold({**obj("web", version - 1), "spec": {"replicas": 1}})  # a late watch event of an older state
    assert version_of(store, "web") == str(version)
    client.patch(DEPLOYMENTS.named("web"), {"spec": {"replicas": 4}})
    assert present(client.get(DEPLOYMENTS.named("web")))["spec"] == {"replicas": 4}
    assert [m for m, _ in api.requests] == ["POST", "PATCH"]


def test_other_collections_are_not_cached(cached: tuple[CachedKube, MemoryKube, Store]) -> None:
    client, api, store = cached
    service = path("", "v1", "services", "default", "web")
    api.put({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"}})
    client.get(service)
    client.get(service)
    assert len(api.requests) == 2 and len(store) == 0


def test_a_deleted_object_is_not_served_from_memory_before_the_watch_says_so(
    cached: tuple[CachedKube, MemoryKube, Store],
) -> None:
    client, _, store = cached
    created = client.create(DEPLOYMENTS, {"metadata": {"name": "web"}})
    client.create(DEPLOYMENTS, {"metadata": {"name": "held"}})
    assert client.delete(DEPLOYMENTS.named("web")) is not None
    assert store.get("default", "web") is None
    store.fold(created)  # a late watch event of the state before the deletion
    assert store.get("default", "web") is None
    # Deleted in the foreground: still there, marked, until its pods are gone.
    client.delete(DEPLOYMENTS.named("held"), propagation="Foreground")
    assert (store.get("default", "held") or {})["metadata"].get("deletionTimestamp")
    # Already gone: nothing is kept either.
    store.fold(obj("ghost", 90))
    assert client.delete(DEPLOYMENTS.named("ghost")) is None
    assert store.get("default", "ghost") is None


def test_a_write_answered_404_drops_the_object_from_memory(cached: tuple[CachedKube, MemoryKube, Store]) -> None:
    client, _, store = cached
    store.fold(obj("web", 5))  # its deletion was never seen (a watch being reopened, say)
    with pytest.raises(NotFound):
        client.patch(DEPLOYMENTS.named("web"), {"spec": {"replicas": 1}})
    assert store.get("default", "web") is None


def test_nothing_is_served_until_ready(cached: tuple[CachedKube, MemoryKube, Store]) -> None:
    client, api, _ = cached
    store = Store()
    ready = threading.Event()
    client.cache(DEPLOYMENTS, store, ready=ready.is_set)
    store.fold(obj("web", 1))
    stored = api.put(deployment("web"))["metadata"]["resourceVersion"]
    assert version_of(store, "web") == "1"
    assert present(client.get(DEPLOYMENTS.named("web")))["metadata"]["resourceVersion"] == stored
    ready.set()
    assert present(client.get(DEPLOYMENTS.named("web")))["metadata"]["resourceVersion"] == stored
    assert len(api.requests) == 1


class ScriptedKube:
    """Lists and watches played from a script: each list returns the next listing, each watch the next
    list of events (or raises the next error)."""

    def __init__(self, listings: list[dict[str, Any]], watches: list[Any], done: threading.Event) -> None:
        self.listings, self.watches, self.done = listings, watches, done
        self.calls: list[str] = []

    def request(self, method: str, ref: Ref, **_: Any) -> dict[str, Any]:
        self.calls.append("list")
        return self.listings.pop(0)

    def watch(
        self, ref: Ref, *, resource_version: str | None, timeout_seconds: int, **_: Any
    ) -> Iterator[dict[str, Any]]:
        self.calls.append(f"watch@{resource_version}")
        if not self.watches:
            self.done.set()
            threading.Event().wait(5)
            return
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        yield from step


def test_reflector_follows_the_watch_and_lists_again_when_it_is_too_old() -> None:
    done = threading.Event()
    seen: list[tuple[str, str]] = []
    scripted = ScriptedKube(
        listings=[
            {"metadata": {"resourceVersion": "10"}, "items": [obj("a", 3), obj("b", 4)]},
            {"metadata": {"resourceVersion": "30"}, "items": [obj("a", 21), obj("c", 25)]},
        ],
        watches=[
            [
                {"type": "MODIFIED", "object": obj("a", 11)},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
                {"type": "DELETED", "object": obj("b", 16)},
            ],
            [{"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}],
            [{"type": "ADDED", "object": obj("d", 31)}],
        ],
        done=done,
    )
    reflector = Reflector(
        scripted,
        DEPLOYMENTS,
        on_change=lambda kind, o: seen.append((kind, o["metadata"]["name"])),
        on_relist=lambda: seen.append(("relisted", "")),
    )
    reflector.start()
    assert done.wait(5)
    reflector.stop()
    store = reflector.store
    assert scripted.calls == ["list", "watch@10", "watch@16", "list", "watch@30", "watch@31"]
    assert reflector.synced.is_set()
    assert version_of(store, "a") == "21" and store.get("default", "b") is None
    assert version_of(store, "c") == "25" and version_of(store, "d") == "31"
    # The first list is no news; the second one is: a and c changed with no event (told as a relist).
    assert seen == [("MODIFIED", "a"), ("DELETED", "b"), ("relisted", ""), ("ADDED", "d")]


class Listing(dict[str, Any]):
    """A list response that can be watched for being freed (a plain dict takes no weak reference)."""


def test_reflector_lets_the_list_go_while_it_watches() -> None:
    done = threading.Event()
    listing = Listing({"metadata": {"resourceVersion": "10"}, "items": [obj("a", 3)]})
    alive = weakref.ref(listing)
    scripted = ScriptedKube(listings=[listing], watches=[], done=done)
    del listing
    reflector = Reflector(scripted, DEPLOYMENTS).start()
    try:
        assert done.wait(5)  # listed, and now inside the watch
        assert version_of(reflector.store, "a") == "3"
        assert alive() is None  # the parsed list is not held for the watch's length
    finally:
        reflector.stop()


def test_reflector_retries_after_an_error_without_losing_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("greyrelease.kube.cache.WATCH_RETRY_WAIT", wait_fixed(0.01))
    done = threading.Event()
    scripted = ScriptedKube(
        listings=[{"metadata": {"resourceVersion": "10"}, "items": []}],
        watches=[ApiError(500, "InternalError", "etcd"), [{"type": "ADDED", "object": obj("a", 12)}]],
        done=done,
    )
    reflector = Reflector(scripted, DEPLOYMENTS).start()
    assert done.wait(5)
    reflector.stop()
    assert scripted.calls == ["list", "watch@10", "watch@10", "watch@12"]
    assert version_of(reflector.store, "a") == "12"


def test_reflector_lists_in_pages_of_the_first_page_s_version_and_keeps_every_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1,201 Deployments on the in-memory API server listed 500 at a time: three LISTs, the last two carrying
    the continue token of the page before, every object in the Store, the watch from the first page's
    version."""
    monkeypatch.setattr("greyrelease.kube.cache.LIST_PAGE", 500)
    kube = MemoryKube(*(deployment(f"app-{i:04}") for i in range(1201)))
    queries: list[dict[str, str]] = []
    served = kube.request

    def request(method: str, ref: Ref, **kw: Any) -> dict[str, Any]:
        queries.append(dict(kw.get("query") or {}))
        return served(method, ref, **kw)

    monkeypatch.setattr(kube, "request", request)
    reflector = Reflector(kube, DEPLOYMENTS).start()
    try:
        assert reflector.synced.wait(5)
        assert len(reflector.store) == 1201
        assert reflector.store.get("default", "app-1200") is not None
    finally:
        reflector.stop()
        kube.end_watches()
    assert [q.get("limit") for q in queries] == ["500", "500", "500"]
    assert "continue" not in queries[0] and all(q.get("continue") for q in queries[1:])
    assert [verb for verb, _ in kube.requests] == ["LIST", "LIST", "LIST", "WATCH"]


def test_the_in_memory_api_server_pages_a_list_and_says_how_many_are_left() -> None:
    kube = MemoryKube(*(deployment(f"app-{i}") for i in range(5)))
    first = kube.request("GET", DEPLOYMENTS, query={"limit": "2"})
    token = first["metadata"]["continue"]
    assert [o["metadata"]["name"] for o in first["items"]] == ["app-0", "app-1"]
    assert first["metadata"]["remainingItemCount"] == 3
    second = kube.request("GET", DEPLOYMENTS, query={"limit": "2", "continue": token})
    last = kube.request("GET", DEPLOYMENTS, query={"limit": "2", "continue": second["metadata"]["continue"]})
    assert [o["metadata"]["name"] for o in second["items"] + last["items"]] == ["app-2", "app-3", "app-4"]
    assert "continue" not in last["metadata"]
    assert (
        second["metadata"]["resourceVersion"]
        == last["metadata"]["resourceVersion"]
        == first["metadata"]["resourceVersion"]
    )
