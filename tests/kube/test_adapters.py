"""The pure halves of the adapters: the canary built from the stable, patches, selector narrowing."""

from __future__ import annotations

import copy
import json

from greyrelease.api.release import Obj
from greyrelease.kube.workload import (
    TEMPLATE_HASH_ANNOTATION,
    build_canary,
    canary_patch,
    current_template_hash,
    stable_image_patch,
    workload_of,
)
from greyrelease.routers.selector import ORIGINAL_SELECTOR_ANNOTATION, narrowing_patch, restoring_patch

STABLE: Obj = {
    "metadata": {
        "name": "web",
        "namespace": "shop",
        "uid": "d-uid",
        "generation": 3,
        "labels": {"app": "web"},
        "annotations": {"deployment.kubernetes.io/revision": "2"},
    },
    "spec": {
        "replicas": 10,
        "selector": {"matchLabels": {"app": "web"}},
        "strategy": {"type": "RollingUpdate"},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "app:v1"}, {"name": "proxy", "image": "envoy:1"}]},
        },
    },
    "status": {
        "observedGeneration": 3,
        "replicas": 10,
        "readyReplicas": 9,
        "updatedReplicas": 10,
        "availableReplicas": 9,
    },
}
RELEASE = {"metadata": {"name": "web-release", "uid": "r-uid"}}


def test_canary_copies_the_template_with_the_new_image_and_a_selector_that_excludes_stable_pods() -> None:
    canary = build_canary(STABLE, RELEASE, image="app:v2", version="v2", replicas=2, container=None)
    assert canary["metadata"]["name"] == "web-canary"
    assert canary["metadata"]["ownerReferences"][0] == {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "name": "web-release",
        "uid": "r-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert canary["spec"]["selector"]["matchLabels"] == {"app": "web", "greyrelease.io/track": "canary"}
    labels = canary["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app": "web", "greyrelease.io/track": "canary", "greyrelease.io/version": "v2"}
    containers = canary["spec"]["template"]["spec"]["containers"]
    assert [c["image"] for c in containers] == ["app:v2", "envoy:1"]
    assert canary["spec"]["replicas"] == 2 and canary["spec"]["strategy"] == {"type": "RollingUpdate"}
    # The stable object was not changed in place.
    assert STABLE["spec"]["template"]["spec"]["containers"][0]["image"] == "app:v1"


def test_named_container_is_the_one_released() -> None:
    canary = build_canary(STABLE, RELEASE, image="envoy:2", version="2", replicas=1, container="proxy")
    assert [c["image"] for c in canary["spec"]["template"]["spec"]["containers"]] == ["app:v1", "envoy:2"]


def test_canary_patch_is_none_when_nothing_changed_and_minimal_otherwise() -> None:
    desired = build_canary(STABLE, RELEASE, image="app:v2", version="v2", replicas=2, container=None)
    existing = copy.deepcopy(desired)
    existing["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"  # a server default
    assert canary_patch(existing, desired) is None
    scaled = build_canary(STABLE, RELEASE, image="app:v2", version="v2", replicas=5, container=None)
    assert canary_patch(existing, scaled) == {"spec": {"replicas": 5}}
    newer = build_canary(STABLE, RELEASE, image="app:v3", version="v3", replicas=2, container=None)
    patch = canary_patch(existing, newer)
    assert (
        patch is not None
        and patch["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
        != existing["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
    )


def test_stable_image_patch() -> None:
    assert stable_image_patch(STABLE, image="app:v1", replicas=10, container=None) is None
    assert stable_image_patch(STABLE, image="app:v2", replicas=10, container=None) == {
        "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:v2"}]}}}
    }
    assert stable_image_patch(STABLE, image="app:v1", replicas=4, container=None) == {"spec": {"replicas": 4}}


def test_workload_of_reads_the_released_container_and_readiness() -> None:
    w = workload_of(STABLE, "proxy", "abc")
    assert (w.name, w.image, w.replicas, w.ready, w.template_hash) == ("web", "envoy:1", 10, 9, "abc")
    assert w.containers == ("app", "proxy")
    assert not w.rolled_out(10, "envoy:1")  # one pod not ready yet


def test_current_template_hash_picks_the_owned_replicaset_of_the_current_revision() -> None:
    def rs(name: str, owner: str, revision: str, hash_: str) -> Obj:
        return {
            "metadata": {
                "name": name,
                "labels": {"pod-template-hash": hash_},
                "annotations": {"deployment.kubernetes.io/revision": revision},
                "ownerReferences": [{"uid": owner, "controller": True}],
            }
        }

    sets = [rs("old", "d-uid", "1", "aaa"), rs("other", "x-uid", "2", "bbb"), rs("cur", "d-uid", "2", "ccc")]
    assert current_template_hash(STABLE, sets) == "ccc"


def test_selector_narrowing_and_exact_restore() -> None:
    svc = {"metadata": {"annotations": {}}, "spec": {"selector": {"app": "web", "tier": "fe"}}}
    patch = narrowing_patch(svc, "hash1")
    assert patch == {
        "metadata": {
            "annotations": {ORIGINAL_SELECTOR_ANNOTATION: json.dumps({"app": "web", "tier": "fe"}, sort_keys=True)}
        },
        "spec": {"selector": {"pod-template-hash": "hash1"}},
    }
    narrowed = {
        "metadata": {"annotations": patch["metadata"]["annotations"]},
        "spec": {"selector": {"app": "web", "tier": "fe", "pod-template-hash": "hash1"}},
    }
    assert narrowing_patch(narrowed, "hash1") is None  # idempotent
    assert restoring_patch(narrowed) == {
        "metadata": {"annotations": {ORIGINAL_SELECTOR_ANNOTATION: None}},
        "spec": {"selector": {"pod-template-hash": None}},
    }
    assert restoring_patch(svc) is None  # never narrowed: nothing to restore
