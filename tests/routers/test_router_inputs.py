"""A router acts on what the action brings, not on a status: the Service mode's abort narrows to the hash
it is given, the nginx and Gateway API modes narrow their stable Service to the hash preparing is given,
and the replica mode's abort scales the canary it was built for."""

from __future__ import annotations

from typing import Any

import pytest
from greyrelease.api.release import GreyReleaseSpec
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.routers import Router, router_for

from tests.support import builders
from tests.support.builders import NS, SERVICE, UID, service

RELEASE = {"metadata": {"name": "web", "namespace": NS, "uid": UID}}
CANARY = path("apps", "v1", "deployments", NS, "web-canary")


def router(kube: MemoryKube, routing: Any, canary: str = "web-canary") -> Router:
    spec = GreyReleaseSpec.model_validate(
        {
            "targetRef": {"name": "web"},
            "targetVersion": "v2",
            "batchSize": 1,
            "canaryWeight": 50,
            "trafficRouting": routing,
        }
    )
    return router_for(kube, namespace=NS, release=RELEASE, spec=spec, canary=canary)


def selector(kube: MemoryKube) -> dict[str, str]:
    return dict((kube.get(SERVICE) or {})["spec"]["selector"])


def test_service_mode_abort_narrows_to_the_hash_it_is_given() -> None:
    kube = MemoryKube(service())
    router(kube, {"service": {"name": "web"}}).set_weight(0, stable_hash="abc123")
    assert selector(kube) == {"app": "web", "pod-template-hash": "abc123"}
    router(kube, {"service": {"name": "web"}}).set_weight(50, stable_hash="abc123")
    assert selector(kube) == {"app": "web"}


def test_service_mode_abort_without_a_hash_leaves_the_service_as_it_is() -> None:
    kube = MemoryKube(service())
    kube.requests.clear()
    router(kube, {"service": {"name": "web"}}).set_weight(0)
    assert selector(kube) == {"app": "web"} and not any(verb == "PATCH" for verb, _ in kube.writes)


INGRESS = builders.ingress()
ROUTE = builders.http_route()


@pytest.mark.parametrize(
    ("routing", "user"),
    [
        pytest.param({"nginx": {"ingress": "web", "stableService": "web"}}, INGRESS, id="nginx"),
        pytest.param({"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}, ROUTE, id="gateway"),
    ],
)
def test_preparing_narrows_the_stable_service_to_the_hash_it_is_given_and_fails_without_one(
    routing: Any, user: dict[str, Any]
) -> None:
    kube = MemoryKube(service(), user)
    with pytest.raises(RuntimeError, match="the stable ReplicaSet is not known yet"):
        router(kube, routing).prepare("")
    assert selector(kube) == {"app": "web"}  # the pass fails, and the next one prepares again
    router(kube, routing).prepare("abc123")
    assert selector(kube) == {"app": "web", "pod-template-hash": "abc123"}


def test_replica_mode_abort_scales_the_canary_it_was_built_for() -> None:
    canary = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web-canary", "namespace": NS, "ownerReferences": [{"uid": UID, "controller": True}]},
        "spec": {"replicas": 2},
    }
    kube = MemoryKube(canary)
    router(kube, None, canary="").set_weight(0)  # no target to name a canary after: nothing to scale
    assert (kube.get(CANARY) or {})["spec"]["replicas"] == 2
    router(kube, None).set_weight(0)
    assert (kube.get(CANARY) or {})["spec"]["replicas"] == 0
