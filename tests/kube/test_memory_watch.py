"""MemoryKube's lists and watches: what a Reflector (and `kubectl gr dashboard`) needs of an API server."""

from __future__ import annotations

import threading
from typing import Any

from greyrelease.kube.cache import Reflector
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path

PODS = path("", "v1", "pods", "shop")
EVENTS = path("", "v1", "events")


def pod(name: str, namespace: str = "shop", **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels}}


def event(name: str, kind: str, involved: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "shop"},
        "involvedObject": {"kind": kind, "name": involved},
    }


def test_a_list_has_the_collections_version_and_honours_both_selectors() -> None:
    kube = MemoryKube(pod("a", app="web"), pod("b", app="db"), pod("c", "other", app="web"))
    kube.put(event("e1", "GreyRelease", "web"))
    kube.put(event("e2", "Deployment", "web"))
    listed = kube.request("GET", PODS, query={"labelSelector": "app=web"})
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a"]
    assert listed["metadata"]["resourceVersion"] == "5"  # the last write's
    everywhere = kube.request("GET", path("", "v1", "pods"))
    assert len(everywhere["items"]) == 3
    found = kube.request("GET", EVENTS, query={"fieldSelector": "involvedObject.kind=GreyRelease"})
    assert [e["metadata"]["name"] for e in found["items"]] == ["e1"]
    other = kube.request("GET", EVENTS, query={"fieldSelector": "involvedObject.kind!=GreyRelease"})
    assert [e["metadata"]["name"] for e in other["items"]] == ["e2"]
    assert kube.request("GET", PODS.named("b"))["metadata"]["labels"] == {"app": "db"}


def test_a_watch_from_a_lists_version_yields_each_change_as_it_is_made() -> None:
    kube = MemoryKube(pod("a"))
    version = kube.request("GET", PODS)["metadata"]["resourceVersion"]
    seen: list[tuple[str, str, str]] = []
    three = threading.Event()

    def follow() -> None:
        for e in kube.watch(PODS, resource_version=version, timeout_seconds=10):
            meta = e["object"]["metadata"]
            seen.append((e["type"], meta["name"], meta["resourceVersion"]))
            if len(seen) == 3:
                three.set()
                return

    watcher = threading.Thread(target=follow)
    watcher.start()
    kube.create(PODS, pod("b"))
    kube.put(pod("other-namespace", "other"))  # not of the collection watched
    kube.patch(PODS.named("a"), {"metadata": {"labels": {"x": "y"}}})
    kube.delete(PODS.named("b"))
    assert three.wait(5)
    watcher.join(5)
    assert seen == [("ADDED", "b", "2"), ("MODIFIED", "a", "4"), ("DELETED", "b", "5")]


def test_a_watch_too_old_for_the_changes_kept_is_gone() -> None:
    kube = MemoryKube(pod("a"))
    kube.KEPT_CHANGES = 2
    version = kube.request("GET", PODS)["metadata"]["resourceVersion"]
    for n in range(3):
        kube.patch(PODS.named("a"), {"metadata": {"labels": {"n": str(n)}}})
    events = list(kube.watch(PODS, resource_version=version, timeout_seconds=1))
    assert events == [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}]


def test_end_watches_closes_an_open_watch() -> None:
    kube = MemoryKube()
    done = threading.Event()

    def follow() -> None:
        list(kube.watch(PODS, resource_version=None, timeout_seconds=60))
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    assert not done.wait(0.2)
    kube.end_watches()
    assert done.wait(5)


def test_a_reflector_on_memorykube_holds_what_the_api_server_holds() -> None:
    kube = MemoryKube(pod("a"), pod("b"))
    changed = threading.Event()
    reflector = Reflector(kube, PODS, on_change=lambda kind, obj: changed.set()).start()
    try:
        assert reflector.synced.wait(5)
        assert {p["metadata"]["name"] for p in reflector.store.values()} == {"a", "b"}
        kube.delete(PODS.named("a"))
        kube.create(PODS, pod("c"))

        def names() -> set[str]:
            return {p["metadata"]["name"] for p in reflector.store.values()}

        for _ in range(50):
            if names() == {"b", "c"}:
                break
            changed.wait(0.1)
            changed.clear()
        assert names() == {"b", "c"}
    finally:
        reflector.stop()
        kube.end_watches()
