"""End-to-end: traffic through an nginx canary Ingress and a Gateway API HTTPRoute.

These tests read back what a proxy would act on: the canary Ingress's ``canary-weight`` annotation,
the HTTPRoute's backendRef weights (on the real Gateway API v1.4.1 standard CRDs, defaults and
validation included), and the Services' selectors, all with the real kubectl. Requests through a real
proxy are in test_dataplane.py and test_traffic.py.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controller import (
    Controller,
    apply_release,
    deploy_app,
    deployment,
    gr,
    status,
    wait_for,
    wait_phase,
)
from e2e.harness.controlplane import Cluster

pytestmark = pytest.mark.e2e
WEIGHT = "nginx.ingress.kubernetes.io/canary-weight"
NGINX = {"nginx": {"ingress": "web", "stableService": "web"}}
GATEWAY = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}

INGRESS: dict[str, Any] = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "Ingress",
    "metadata": {"name": "web", "annotations": {"nginx.ingress.kubernetes.io/proxy-body-size": "8m"}},
    "spec": {
        "ingressClassName": "nginx",
        "tls": [{"hosts": ["web.example"], "secretName": "web-tls"}],
        "rules": [
            {
                "host": "web.example",
                "http": {
                    "paths": [
                        {
                            "path": "/",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": "web", "port": {"number": 80}}},
                        },
                        {
                            "path": "/static",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": "static", "port": {"number": 80}}},
                        },
                    ]
                },
            }
        ],
    },
}
ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "web"},
    "spec": {
        "parentRefs": [{"name": "gw"}],
        "hostnames": ["web.example"],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/static"}}],
                "backendRefs": [{"name": "static", "port": 80}],
            },
            {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": "web", "port": 80}]},
        ],
    },
}
ROUTERS = [pytest.param(NGINX, id="nginx"), pytest.param(GATEWAY, id="gateway")]


@pytest.fixture(scope="session")
def httproute_crd(gateway_api_crds: list[Path]) -> Path:
    return next(p for p in gateway_api_crds if p.name.endswith("_httproutes.yaml"))


def get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def setup_app(cluster: Cluster, namespace: str, routing: dict[str, Any], replicas: int = 4) -> dict[str, Any]:
    """The app, its Service and the user's Ingress or HTTPRoute; returns the routing object as stored."""
    deploy_app(cluster, namespace, replicas=replicas)
    body, kind = (INGRESS, "ingress") if "nginx" in routing else (ROUTE, "httproute")
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
    stored = get(cluster, namespace, kind, "web")
    assert stored is not None
    return stored


def read_weight(cluster: Cluster, namespace: str, routing: dict[str, Any]) -> int | None:
    """The canary's weight as the Ingress controller or Gateway would read it; None: no canary route."""
    if "nginx" in routing:
        ing = get(cluster, namespace, "ingress", "web-canary")
        value = ((ing or {}).get("metadata", {}).get("annotations") or {}).get(WEIGHT)
        return None if value is None else int(value)
    route = get(cluster, namespace, "httproute", "web") or {}
    weights: dict[str, int] = {}
    for rule in route.get("spec", {}).get("rules") or []:
        names = [r["name"] for r in rule.get("backendRefs") or []]
        if "web" in names:
            weights = {r["name"]: r.get("weight", 1) for r in rule["backendRefs"]}
    if "web-canary" not in weights:
        return None
    assert weights["web"] + weights["web-canary"] == 100, weights
    return weights["web-canary"]


def header_routed(cluster: Cluster, namespace: str, routing: dict[str, Any]) -> dict[str, str]:
    """The headers that send a request to the canary whatever the weight."""
    if "nginx" in routing:
        canary = get(cluster, namespace, "ingress", "web-canary") or {}
        annotations = canary.get("metadata", {}).get("annotations") or {}
        name = annotations.get("nginx.ingress.kubernetes.io/canary-by-header")
        return {name: annotations["nginx.ingress.kubernetes.io/canary-by-header-value"]} if name else {}
    rules = (get(cluster, namespace, "httproute", "web") or {}).get("spec", {}).get("rules") or []
    first = rules[0]
    if [r["name"] for r in first.get("backendRefs") or []] != ["web-canary"]:
        return {}
    return {h["name"]: h["value"] for h in first["matches"][0].get("headers") or []}


def selector(cluster: Cluster, namespace: str, name: str) -> dict[str, str] | None:
    svc = get(cluster, namespace, "service", name)
    return None if svc is None else svc["spec"].get("selector")


def assert_left_as_written(cluster: Cluster, namespace: str, routing: dict[str, Any], applied: dict[str, Any]) -> None:
    """No canary Ingress or Service; the stable Service and the user's route exactly as before."""
    assert get(cluster, namespace, "ingress", "web-canary") is None
    assert get(cluster, namespace, "service", "web-canary") is None
    svc = get(cluster, namespace, "service", "web")
    assert svc is not None and svc["spec"]["selector"] == {"app": "web"}
    assert "greyrelease.io/original-selector" not in (svc["metadata"].get("annotations") or {})
    kind = "ingress" if "nginx" in routing else "httproute"
    now = get(cluster, namespace, kind, "web")
    assert now is not None and now["spec"] == applied["spec"]
    assert (now["metadata"].get("annotations") or {}) == (applied["metadata"].get("annotations") or {})


def live_batch(cluster: Cluster, namespace: str, k: int) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        st = status(cluster, namespace, "web")
        return st if st.get("currentBatch") == k and (st.get("batchTimes") or {}).get("readyAt") else None

    return check


@pytest.mark.parametrize("routing", ROUTERS)
def test_full_release_sets_the_planned_weight_at_every_batch_and_leaves_routing_as_written(
    cluster: Cluster, namespace: str, controller: Controller, httproute_crd: Path, routing: dict[str, Any]
) -> None:
    applied = setup_app(cluster, namespace, routing)
    planned = [20, 50, 80, 100]
    batches = [{"replicas": r, "weight": w, "pause": "manual"} for r, w in zip((1, 2, 3, 4), planned, strict=True)]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=routing),
    )
    for k, weight in enumerate(planned, start=1):
        wait_for(live_batch(cluster, namespace, k), 60, f"batch {k} live")
        assert read_weight(cluster, namespace, routing) == weight, controller.logs()
        # The stable Service is narrowed to the stable ReplicaSet; the canary Service selects the canary.
        stable_selector = selector(cluster, namespace, "web") or {}
        assert stable_selector.get("app") == "web" and "pod-template-hash" in stable_selector
        assert selector(cluster, namespace, "web-canary") == {"app": "web", "greyrelease.io/track": "canary"}
        assert (deployment(cluster, namespace, "web") or {})["spec"]["replicas"] == 4  # the stable keeps its size
        cluster.kubectl("annotate", "gr", "web", "-n", namespace, "greyrelease.io/promote=next")
    st = wait_phase(cluster, namespace, "web", {"Succeeded", "Failed", "Aborted"}, timeout=90)
    assert st["phase"] == "Succeeded", (st, controller.logs())
    assert_left_as_written(cluster, namespace, routing, applied)
    dep = deployment(cluster, namespace, "web")
    assert dep is not None and dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v2"
    assert deployment(cluster, namespace, "web-canary") is None


@pytest.mark.parametrize("routing", ROUTERS)
def test_abort_mid_batch_sends_the_weight_to_zero_within_a_second(
    cluster: Cluster, namespace: str, controller: Controller, httproute_crd: Path, routing: dict[str, Any]
) -> None:
    applied = setup_app(cluster, namespace, routing)
    batches = [{"replicas": 2, "weight": 30, "pause": "manual"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=routing),
    )
    wait_for(live_batch(cluster, namespace, 1), 60, "batch 1 live")
    assert read_weight(cluster, namespace, routing) == 30

    cluster.kubectl("annotate", "gr", "web", "-n", namespace, "greyrelease.io/abort=true")
    t0 = time.monotonic()
    wait_for(lambda: read_weight(cluster, namespace, routing) in (0, None), 10, "canary weight 0", interval=0.05)
    cut = time.monotonic() - t0
    print(f"\n{next(iter(routing))}: canary weight 0 {cut:.3f}s after the abort annotation")
    assert cut <= 1.0, f"canary still weighted {cut:.2f}s after the abort annotation"

    st = wait_phase(cluster, namespace, "web", {"Aborted"}, timeout=60)
    assert st["canaryWeight"] == 0
    assert_left_as_written(cluster, namespace, routing, applied)
    assert deployment(cluster, namespace, "web-canary") is None
    dep = deployment(cluster, namespace, "web")
    assert dep is not None and dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v1"


@pytest.mark.parametrize("routing", ROUTERS)
def test_deleting_the_release_mid_batch_removes_the_canary_routing(
    cluster: Cluster, namespace: str, controller: Controller, httproute_crd: Path, routing: dict[str, Any]
) -> None:
    applied = setup_app(cluster, namespace, routing)
    batches = [{"replicas": 2, "weight": 40, "pause": "manual", "headerMatch": {"x-canary": "always"}}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=routing),
    )
    wait_for(live_batch(cluster, namespace, 1), 60, "batch 1 live")
    assert read_weight(cluster, namespace, routing) == 40
    assert header_routed(cluster, namespace, routing) == {"x-canary": "always"}
    cluster.kubectl("delete", "gr", "web", "-n", namespace, "--timeout=60s")
    assert_left_as_written(cluster, namespace, routing, applied)
    assert deployment(cluster, namespace, "web-canary") is None
    assert (deployment(cluster, namespace, "web") or {})["spec"]["replicas"] == 4


def test_an_ingress_with_the_canary_name_that_is_not_ours_is_refused_and_untouched(
    cluster: Cluster, namespace: str, controller: Controller
) -> None:
    setup_app(cluster, namespace, NGINX)
    theirs = copy.deepcopy(INGRESS)
    theirs["metadata"]["name"] = "web-canary"
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(theirs))
    before = get(cluster, namespace, "ingress", "web-canary")
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batchSize=2, canaryWeight=50, trafficRouting=NGINX),
    )
    st = wait_phase(cluster, namespace, "web", {"InvalidSpec", "Progressing"}, timeout=30)
    assert st["phase"] == "InvalidSpec", st
    assert "Ingress 'web-canary'" in st["message"] and "not owned by this release" in st["message"], st["message"]
    time.sleep(2)  # a few more passes, and still nothing touched
    assert get(cluster, namespace, "ingress", "web-canary") == before
    assert get(cluster, namespace, "service", "web-canary") is None
    assert deployment(cluster, namespace, "web-canary") is None
    assert selector(cluster, namespace, "web") == {"app": "web"}
