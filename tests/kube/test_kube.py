"""The in-memory API server answers as a real one does, for what the controller relies on."""

from __future__ import annotations

from typing import Any

import pytest
from greyrelease.kube.memory import MemoryKube, merge_patch, strategic_merge_patch
from greyrelease.kube.protocol import STRATEGIC, Conflict, NotFound, Ref, path, selects

DEPLOYMENTS = path("apps", "v1", "deployments", "shop")
WEB = path("apps", "v1", "deployments", "shop", "web")


def deployment(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": spec,
    }


def test_references_are_built_from_their_parts_and_give_the_rest_path() -> None:
    status = path("greyrelease.io", "v1", "greyreleases", "shop", "web", "status")
    assert (status.api, status.resource, status.namespace, status.name, status.subresource) == (
        "/apis/greyrelease.io/v1",
        "greyreleases",
        "shop",
        "web",
        "status",
    )
    assert status.path == str(status) == "/apis/greyrelease.io/v1/namespaces/shop/greyreleases/web/status"
    namespace = path("", "v1", "namespaces", name="shop")
    assert (namespace.resource, namespace.namespace, namespace.name) == ("namespaces", None, "shop")
    assert namespace.path == "/api/v1/namespaces/shop"
    assert path("", "v1", "pods").path == "/api/v1/pods"
    # The helpers: a collection, an object of it, its subresource; names are quoted in the path.
    assert status.collection == path("greyrelease.io", "v1", "greyreleases", "shop")
    assert status.collection == Ref("greyrelease.io", "v1", "greyreleases", namespace="shop")
    assert DEPLOYMENTS.named("web") == WEB and WEB.sub("status").collection == DEPLOYMENTS
    assert WEB.gvr == DEPLOYMENTS.gvr == ("apps", "v1", "deployments")
    assert DEPLOYMENTS.named("a b").path == "/apis/apps/v1/namespaces/shop/deployments/a%20b"
    with pytest.raises(ValueError):
        DEPLOYMENTS.sub("status")


def test_create_get_and_the_answers_for_missing_and_taken_names() -> None:
    kube = MemoryKube()
    created = kube.create(DEPLOYMENTS, deployment(replicas=1))
    meta = created["metadata"]
    assert meta["namespace"] == "shop" and meta["uid"] and meta["generation"] == 1 and meta["resourceVersion"]
    assert kube.get(WEB) == created
    with pytest.raises(Conflict):
        kube.create(DEPLOYMENTS, deployment(replicas=1))
    assert kube.get(path("apps", "v1", "deployments", "shop", "other")) is None
    with pytest.raises(NotFound):
        kube.patch(path("apps", "v1", "deployments", "shop", "other"), {"spec": {"replicas": 2}})


def test_writes_bump_the_resource_version_and_a_spec_change_the_generation() -> None:
    kube = MemoryKube()
    v1 = kube.create(DEPLOYMENTS, deployment(replicas=1))
    v2 = kube.patch(WEB, {"metadata": {"labels": {"a": "b"}}})
    v3 = kube.patch(WEB, {"spec": {"replicas": 3}})
    versions = [int(v["metadata"]["resourceVersion"]) for v in (v1, v2, v3)]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert [v["metadata"]["generation"] for v in (v1, v2, v3)] == [1, 1, 2]


def test_a_stale_resource_version_is_a_conflict() -> None:
    kube = MemoryKube()
    old = kube.create(DEPLOYMENTS, deployment(replicas=1))
    kube.patch(WEB, {"spec": {"replicas": 2}})
    with pytest.raises(Conflict):
        kube.patch(WEB, {"metadata": {"resourceVersion": old["metadata"]["resourceVersion"]}, "spec": {"replicas": 5}})
    with pytest.raises(Conflict):
        kube.replace(WEB, {**old, "spec": {"replicas": 5}})
    current = kube.get(WEB) or {}
    assert current["spec"] == {"replicas": 2}
    assert kube.replace(WEB, {**current, "spec": {"replicas": 5}})["spec"] == {"replicas": 5}


def test_the_status_subresource_is_written_apart_from_the_object() -> None:
    kube = MemoryKube(deployment(replicas=1))
    kube.patch(WEB, {"spec": {"replicas": 2}, "status": {"replicas": 9}})
    assert "status" not in (kube.get(WEB) or {})
    kube.patch(WEB.sub("status"), {"spec": {"replicas": 7}, "status": {"replicas": 2, "note": None}})
    web = kube.get(WEB) or {}
    assert web["status"] == {"replicas": 2} and web["spec"] == {"replicas": 2}


def test_deletion_waits_for_finalizers_and_the_foreground_for_the_collector() -> None:
    kube = MemoryKube()
    kube.create(DEPLOYMENTS, deployment())
    marked = kube.delete(WEB, propagation="Foreground")
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    assert (kube.get(WEB) or {})["metadata"]["finalizers"] == ["foregroundDeletion"]
    kube.collect()
    assert kube.get(WEB) is None and kube.delete(WEB) is None
    held = {
        **deployment(),
        "metadata": {"name": "web", "namespace": "shop", "finalizers": ["greyrelease.io/finalizer"]},
    }
    kube.put(held)
    kube.delete(WEB)
    assert (kube.get(WEB) or {})["metadata"]["deletionTimestamp"]
    kube.patch(WEB, {"metadata": {"finalizers": None}})  # the last finalizer removed: the object goes
    assert kube.get(WEB) is None


def test_lists_select_by_labels() -> None:
    kube = MemoryKube()
    for name, labels in (("a", {"app": "web"}), ("b", {"app": "web", "greyrelease.io/track": "canary"}), ("c", {})):
        kube.create(DEPLOYMENTS, {"metadata": {"name": name, "labels": labels}})
    names = [d["metadata"]["name"] for d in kube.list(DEPLOYMENTS, label_selector="app=web,!greyrelease.io/track")]
    assert names == ["a"]
    assert len(kube.list(DEPLOYMENTS)) == 3 and kube.list(path("apps", "v1", "deployments", "other")) == []
    assert selects("a!=b,c", {"a": "x", "c": ""}) and not selects("a==b", {"a": "x"})


def test_merge_and_strategic_merge_patches() -> None:
    pod = {"containers": [{"name": "app", "image": "v1", "ports": [1]}, {"name": "proxy", "image": "e1"}], "x": 1}
    assert merge_patch(pod, {"containers": [{"name": "app", "image": "v2"}], "x": None}) == {
        "containers": [{"name": "app", "image": "v2"}]
    }
    assert strategic_merge_patch(pod, {"containers": [{"name": "app", "image": "v2"}]}) == {
        "containers": [{"name": "app", "image": "v2", "ports": [1]}, {"name": "proxy", "image": "e1"}],
        "x": 1,
    }
    kube = MemoryKube(deployment(template={"spec": pod}))
    kube.patch(
        WEB, {"spec": {"template": {"spec": {"containers": [{"name": "proxy", "image": "e2"}]}}}}, patch_type=STRATEGIC
    )
    containers = (kube.get(WEB) or {})["spec"]["template"]["spec"]["containers"]
    assert [c["image"] for c in containers] == ["v1", "e2"]


def test_faults_and_the_request_log() -> None:
    kube = MemoryKube(deployment())

    def refuse_writes(verb: str, p: Ref) -> None:
        if verb in MemoryKube.WRITE_VERBS:
            raise Conflict(409, "Conflict", "no")

    kube.before = refuse_writes
    assert kube.get(WEB) is not None
    with pytest.raises(Conflict):
        kube.patch(WEB, {"spec": {"replicas": 3}})
    assert kube.requests == [("GET", WEB), ("PATCH", WEB)] and kube.writes == [("PATCH", WEB)]
